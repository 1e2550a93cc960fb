"""Health rules as data: a signal, a threshold, a window, a severity, a scope and the action to recommend.

The defaults follow NVIDIA's XID catalog, DCGM's health watches and NVSentinel: hardware XIDs are fatal (and,
as an XID is an event that leaves nothing to watch clear, what they take out waits for a reboot or an operator's
release before its probation: `needs_reset`), application XIDs (13, 31, 43, 45, 68: a bad kernel, not a bad GPU)
are ignored; XIDs that ask for a reset when convenient (63: a row remapped or a page retired, applied at the next
reset; 92: a high single-bit error rate; 94: an uncorrectable error contained to the process that hit it) drain
the GPU with checkpoint grace instead of interrupting it; a volatile double-bit ECC error, a failed row remap or a
GPU off the bus take the GPU out at once; pending remaps and retired-page limits (pre-Ampere) call for a reset;
correctable ECC, NVLink and PCIe error *rates* above budget, seen 3 times within a minute, degrade (isolated
correctable errors are normal and never reach them); thermal and power throttling are warnings with flap
suppression, and thermal throttling held for a whole minute degrades; a node silent for three intervals (and at
least 30 s), or one reporting fewer GPUs than it has, is taken out whole. Operators extend or override the list
with a YAML file of rules (`CHAMBER_HEALTH_RULES_FILE`; a rule with a default's name replaces it).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from chamber.common.contracts import GpuSample, GpuXidEvent, NodeTelemetry

THERMAL_MASK = 0x20 | 0x40  # HW thermal slowdown, SW thermal slowdown
POWER_MASK = 0x08 | 0x80  # HW slowdown, HW power brake slowdown
"""Not the SW power cap (0x04): a GPU working at its power limit sets it all the time (an H200 at 659 of 700 W,
running bf16 matrix products, does), so counting it would mark every busy GPU suspect."""


class Severity(StrEnum):
    WARNING = "warning"
    DEGRADED = "degraded"
    FATAL = "fatal"


Signal = Literal[
    "xid",
    "ecc_dbe_volatile",
    "ecc_sbe_rate",
    "remapped_rows_failure",
    "remapped_rows_pending",
    "retired_pages_total",
    "retired_pages_pending",
    "nvlink_error_rate",
    "pcie_replay_rate",
    "thermal_throttle",
    "power_throttle",
    "recovery_action",
    "heartbeat_loss",
    "gpu_count_drop",
]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    signal: Signal
    severity: Severity
    threshold: float = 0.0
    """The rule fires when the signal's value is above this."""
    count: int = 1
    """...this many times..."""
    window_s: float = 0.0
    """...within this window (0: a single occurrence is enough)."""
    sustain_s: float = 0.0
    """Instead of a count: the signal is above threshold in every sample for this long (0: not used)."""
    scope: Literal["gpu", "node"] = "gpu"
    action: Literal["", "reset-gpu", "reboot-node", "rma"] = ""
    xids: tuple[int, ...] = ()
    needs_reset: bool = False
    """Only a reset clears the fault, and it leaves nothing to watch clear (an XID is an event, not a counter):
    clean samples prove nothing, so what it quarantines waits for a reboot (a new boot ID) or an operator's
    release before its probation starts."""


DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("xid-fallen-off-bus", "xid", Severity.FATAL, xids=(79,), scope="node", action="reboot-node",
         needs_reset=True),
    Rule("xid-double-bit-ecc", "xid", Severity.FATAL, xids=(48, 64, 95), action="reset-gpu", needs_reset=True),
    Rule("xid-ecc-reset-due", "xid", Severity.DEGRADED, xids=(63, 92, 94), action="reset-gpu"),
    Rule("xid-nvlink", "xid", Severity.FATAL, xids=(74,), action="reset-gpu", needs_reset=True),
    Rule("xid-gsp", "xid", Severity.FATAL, xids=(119, 120, 136, 140, 143), action="reboot-node", needs_reset=True),
    Rule("xid-other-hardware", "xid", Severity.FATAL, xids=(123,), action="rma", needs_reset=True),
    Rule("ecc-dbe-volatile", "ecc_dbe_volatile", Severity.FATAL, action="reset-gpu"),
    Rule("row-remap-failure", "remapped_rows_failure", Severity.FATAL, action="rma"),
    Rule("row-remap-pending", "remapped_rows_pending", Severity.DEGRADED, action="reset-gpu"),
    Rule("retired-pages-limit", "retired_pages_total", Severity.FATAL, threshold=59, action="rma"),
    Rule("retired-pages-pending", "retired_pages_pending", Severity.DEGRADED, action="reset-gpu"),
    Rule("ecc-sbe-rate", "ecc_sbe_rate", Severity.DEGRADED, threshold=10.0, count=3, window_s=60,
         action="reset-gpu"),
    Rule("nvlink-error-rate", "nvlink_error_rate", Severity.DEGRADED, threshold=10.0, count=3, window_s=60,
         action="reset-gpu"),
    Rule("pcie-replay-rate", "pcie_replay_rate", Severity.DEGRADED, threshold=8.0, count=3, window_s=60,
         action="reboot-node"),
    Rule("thermal-throttle", "thermal_throttle", Severity.WARNING, count=3, window_s=60),
    Rule("thermal-throttle-sustained", "thermal_throttle", Severity.DEGRADED, sustain_s=60),
    Rule("power-throttle", "power_throttle", Severity.WARNING, count=3, window_s=60),
    Rule("nvml-recovery-action", "recovery_action", Severity.DEGRADED, action="reset-gpu"),
    Rule("heartbeat-loss", "heartbeat_loss", Severity.FATAL, scope="node", action="reboot-node"),
    # In every batch for 10 s: one batch missing a GPU (an NVML read that failed once) quarantined the whole node,
    # interrupting the jobs on all its GPUs (found by review); a GPU truly gone stays gone (and XID 79 is at once).
    Rule("gpu-count-drop", "gpu_count_drop", Severity.FATAL, scope="node", action="reboot-node", sustain_s=10),
)  # fmt: skip


def as_batch(event: GpuXidEvent) -> NodeTelemetry:
    """An XID event seen as a one-GPU observation (interval 0: not a heartbeat), so the same rules judge it."""
    sample = GpuSample(index=event.gpu_index, uuid=event.uuid, xids=[event.xid])
    return NodeTelemetry(node=event.node, sampled_at=event.observed_at, interval_s=0.0, gpus=[sample], source="nvml")


class RuleError(ValueError):
    """A rules file that cannot be used; the message names the rule and the field."""


def merge_rules(extra: list[object], base: tuple[Rule, ...] = DEFAULT_RULES) -> tuple[Rule, ...]:
    """The default rules, with `extra` (plain dicts, e.g. from YAML) added or replacing those of the same name.

    Strict: a key a rule does not have (`treshold`) is an error, not silently dropped; a count below 1 or a
    negative window is an error too.
    """
    import msgspec

    from chamber.common.codec import unknown_fields

    rules = {r.name: r for r in base}
    for i, raw in enumerate(extra):
        name = raw.get("name", "?") if isinstance(raw, dict) else "?"
        where = f"health rule #{i + 1} ({name})"
        if not isinstance(raw, dict):
            raise RuleError(f"{where}: expected a mapping of rule fields, got {type(raw).__name__}")
        unknown = unknown_fields(raw, Rule)
        if unknown:
            raise RuleError(f"{where}: unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)}")
        try:
            rule = msgspec.convert(raw, Rule)
        except msgspec.ValidationError as exc:
            raise RuleError(f"{where}: {exc}") from exc
        if rule.count < 1 or rule.window_s < 0:
            raise RuleError(f"{where}: count must be at least 1 and window_s at least 0")
        rules[rule.name] = rule
    return tuple(rules.values())


Counters = tuple[float, int | None, int | None, int | None]
"""A GPU's sample time and its correctable ECC, NVLink and PCIe counters."""


@dataclass
class CounterHistory:
    """Each GPU's previous counters, to turn cumulative counters into rates (one entry per GPU)."""

    last: dict[tuple[str, int], Counters] = field(default_factory=dict)

    def rates(self, key: tuple[str, int], now: Counters) -> tuple[float | None, float | None, float | None]:
        """Per counter: its increase per second since the GPU's previous sample (None: no previous value)."""
        prev = self.last.get(key)
        self.last[key] = now
        if prev is None or now[0] <= prev[0]:
            return None, None, None
        dt = now[0] - prev[0]
        return _rate(prev[1], now[1], dt), _rate(prev[2], now[2], dt), _rate(prev[3], now[3], dt)


def _rate(before: int | None, after: int | None, dt: float) -> float | None:
    """A counter that went down was reset (a GPU reset clears volatile counters): no errors, not negative ones."""
    if before is None or after is None:
        return None
    return max(0.0, (after - before) / dt)


def gpu_signals(sample: GpuSample, history: CounterHistory | None, node: str, at: float) -> Mapping[str, float]:
    """The values of every GPU-scoped signal a sample carries (absent fields give no signal).

    `history` None: the observation is not a sample of the GPU's series (an XID event between two samples): it
    gives no rates and leaves the history alone, which would otherwise lose the previous sample's counters."""
    out: dict[str, float] = {}
    if sample.ecc_dbe_volatile is not None:
        out["ecc_dbe_volatile"] = float(sample.ecc_dbe_volatile)
    if sample.remapped_rows_failure is not None:
        out["remapped_rows_failure"] = float(sample.remapped_rows_failure)
    if sample.remapped_rows_pending is not None:
        out["remapped_rows_pending"] = float(sample.remapped_rows_pending)
    if sample.retired_pages_dbe is not None or sample.retired_pages_sbe is not None:
        out["retired_pages_total"] = float((sample.retired_pages_dbe or 0) + (sample.retired_pages_sbe or 0))
    if sample.retired_pages_pending is not None:
        out["retired_pages_pending"] = float(sample.retired_pages_pending)
    nvlink = None
    if sample.nvlink_replay_errors is not None or sample.nvlink_crc_errors is not None:
        nvlink = (
            (sample.nvlink_replay_errors or 0) + (sample.nvlink_recovery_errors or 0) + (sample.nvlink_crc_errors or 0)
        )
    sbe = nvl = pcie = None
    if history is not None:
        counters = (at, sample.ecc_sbe_volatile, nvlink, sample.pcie_replay_count)
        sbe, nvl, pcie = history.rates((node, sample.index), counters)
    if sbe is not None:
        out["ecc_sbe_rate"] = sbe
    if nvl is not None:
        out["nvlink_error_rate"] = nvl
    if pcie is not None:
        out["pcie_replay_rate"] = pcie
    if sample.clock_event_reasons is not None:
        out["thermal_throttle"] = float(bool(sample.clock_event_reasons & THERMAL_MASK))
        out["power_throttle"] = float(bool(sample.clock_event_reasons & POWER_MASK))
    if sample.recovery_action is not None:
        out["recovery_action"] = float(sample.recovery_action)
    return out


class RuleIndex:
    """The rules by signal, so that a sample is checked against the rules of the signals it carries only."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.by_signal: dict[str, list[Rule]] = {}
        self.xid_rules = [r for r in rules if r.signal == "xid"]
        self.zero_is_quiet = all(r.threshold >= 0 for r in rules)
        """No rule fires on a zero (the usual value of every signal): zeros need no lookup."""
        for rule in rules:
            if rule.signal != "xid":
                self.by_signal.setdefault(rule.signal, []).append(rule)

    def match(self, signals: Mapping[str, float], xids: list[int]) -> list[tuple[Rule, float]]:
        """Like `matching`, with the same hits in the same order for any one signal."""
        hits = []
        if xids:
            hits = [(rule, float(x)) for rule in self.xid_rules for x in [next((x for x in xids if x in rule.xids), -1)]
                    if x >= 0]  # fmt: skip
        for signal, value in signals.items():
            if value == 0.0 and self.zero_is_quiet:
                continue
            for rule in self.by_signal.get(signal, ()):
                if value > rule.threshold:
                    hits.append((rule, value))
        return hits


def matching(rules: tuple[Rule, ...], signals: Mapping[str, float], xids: list[int]) -> list[tuple[Rule, float]]:
    """The rules whose signal is above threshold in this observation, with the value seen (the definition that
    `RuleIndex.match` implements faster)."""
    hits = []
    for rule in rules:
        if rule.signal == "xid":
            for xid in xids:
                if xid in rule.xids:
                    hits.append((rule, float(xid)))
                    break
            continue
        value = signals.get(rule.signal)
        if value is not None and value > rule.threshold:
            hits.append((rule, value))
    return hits
