"""What `chamber up` runs on a machine with NVIDIA GPUs: the node agent on them and the process executor, so one
command gives a working scheduler for that server. Elsewhere, or when the environment says otherwise, the
simulated fleet stays."""

from collections.abc import Callable, Mapping


def local_defaults(env: Mapping[str, str], count: Callable[[str], int] | None = None) -> dict[str, str]:
    """The settings to add for this machine: none when the collector's role or the simulated executor is chosen
    explicitly, or when NVML finds no GPU here."""
    if env.get("CHAMBER_COLLECTOR_ROLE") or env.get("CHAMBER_EXECUTOR") == "simulated":
        return {}
    if count is None:
        from chamber.collector.nvml import count_gpus

        count = count_gpus
    if count(env.get("CHAMBER_NVML_MODULE", "")) == 0:
        return {}
    return {"CHAMBER_COLLECTOR_ROLE": "local", "CHAMBER_EXECUTOR": env.get("CHAMBER_EXECUTOR") or "process"}
