"""How busy a GPU is, from NVML's GPM activity counters: the one rule for a GPU's usage.

usage = 100 x max(SM activity, tensor activity, DRAM bandwidth), because a GPU can be saturated by any one of
them (a memory-bound kernel keeps SMs half idle); and 0 when the GPU draws under 10% of its power limit, because a
GPU at idle power does no useful work whatever a counter shows. None when the GPU offers none of the counters
(GPM needs Hopper or newer), so no zero is mistaken for a reading.
"""

IDLE_POWER_SHARE = 0.10


def usage_percent(
    sm: float | None, tensor: float | None, dram: float | None, power_w: float | None, power_limit_w: float | None
) -> float | None:
    """0-100 from activity ratios (0-1); None without any of them."""
    ratios = [r for r in (sm, tensor, dram) if r is not None]
    if not ratios:
        return None
    if power_w is not None and power_limit_w and power_w < IDLE_POWER_SHARE * power_limit_w:
        return 0.0
    return round(100.0 * max(0.0, min(1.0, max(ratios))), 2)
