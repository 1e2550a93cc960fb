"""Health verdicts about GPUs and nodes, with their evidence."""

from enum import StrEnum
from typing import Literal

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
    severity: str = ""
    """`warning`, `degraded` (drained with checkpoint grace) or `fatal` (jobs interrupted at once)."""
    rule: str = ""
    action: str = ""
    """What an operator should do: `reset-gpu`, `reboot-node`, `rma`, or empty."""
    held: bool = False
    """Out until an operator releases it (an operator cordon, or a repeat offender)."""
    breaker_open: bool = False
    """The circuit breaker held this quarantine back (too much of the fleet at once): an alert, not a cordon."""
    awaiting_reset: bool = False
    """Quarantined by a fault only a reset clears, which left no counter to watch (a fatal XID): no probation
    starts until the node reports from another boot (`boot_id`) or an operator releases it."""
    boot_id: str = ""
    """The node's boot when it was quarantined awaiting a reset (empty: not known)."""


class HealthCommand(Event, frozen=True):
    """An operator's order about a node or one GPU of it: `cordon` it, or `release` it (also repeat offenders)."""

    node: str
    gpu_index: int | None
    command: Literal["cordon", "release"]
    reason: str = ""
    issued_at: float = 0.0
