"""Per-GPU samples, batched per node. A capability a GPU lacks is an absent (None) field, never a fake zero."""

import msgspec

from chamber.common.contracts.base import Contract, Event


class GpuSample(Contract, frozen=True):
    index: int
    uuid: str
    gpu_util: float | None = None
    mem_util: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_volatile: int | None = None
    xids: list[int] = msgspec.field(default_factory=list)


class NodeTelemetry(Event, frozen=True):
    node: str
    sampled_at: float
    interval_s: float
    gpus: list[GpuSample]
