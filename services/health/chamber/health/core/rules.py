"""The walking skeleton's rules: a GPU with a volatile double-bit ECC error or a fatal XID is quarantined.

Data-driven rules, suspect states, recovery and the circuit breaker come with the health issue.
"""

from collections.abc import Mapping

from chamber.common.contracts import GpuHealthVerdict, GpuSample, GpuXidEvent, HealthState, NodeTelemetry

FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95, 119, 120, 140})
"""XIDs that mean the hardware (not the application) failed: DBE, row remap, NVLink, fallen off the bus, GSP."""


def as_batch(event: GpuXidEvent) -> NodeTelemetry:
    """An XID event seen as a one-GPU telemetry batch, so the same rules judge it."""
    sample = GpuSample(index=event.gpu_index, uuid=event.uuid, xids=[event.xid])
    return NodeTelemetry(node=event.node, sampled_at=event.observed_at, interval_s=0.0, gpus=[sample], source="nvml")


def evaluate(batch: NodeTelemetry, states: Mapping[tuple[str, int], HealthState]) -> list[GpuHealthVerdict]:
    verdicts = []
    for gpu in batch.gpus:
        if states.get((batch.node, gpu.index), HealthState.HEALTHY) == HealthState.QUARANTINED:
            continue
        reason = ""
        evidence: dict[str, float] = {}
        if gpu.ecc_dbe_volatile:
            reason = "volatile double-bit ECC errors"
            evidence["ecc_dbe_volatile"] = float(gpu.ecc_dbe_volatile)
        fatal = sorted(x for x in gpu.xids if x in FATAL_XIDS)
        if fatal:
            reason = reason or f"fatal XID {fatal[0]}"
            evidence["xid"] = float(fatal[0])
        if reason:
            verdicts.append(
                GpuHealthVerdict(
                    node=batch.node,
                    gpu_index=gpu.index,
                    uuid=gpu.uuid,
                    state=HealthState.QUARANTINED,
                    reason=reason,
                    observed_at=batch.sampled_at,
                    evidence=evidence,
                )
            )
    return verdicts
