"""Health verdicts about GPUs and nodes, with their evidence."""

from enum import StrEnum

import msgspec

from chamber.common.contracts.base import Event


class HealthState(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    QUARANTINED = "quarantined"
    RECOVERING = "recovering"


class GpuHealthVerdict(Event, frozen=True):
    node: str
    gpu_index: int | None
    """None when the verdict covers the whole node."""
    state: HealthState
    reason: str
    observed_at: float
    uuid: str = ""
    evidence: dict[str, float] = msgspec.field(default_factory=dict)
