"""The event contracts every service speaks, in one place.

All messages on the bus are msgspec Structs encoded as JSON. Each top-level event carries a `kind` tag (so a
stream can hold a tagged union) and a schema version `v`. Evolution rule: a field added after version 1 must
have a default, so old messages still decode (tests/contracts/test_schema_evolution.py enforces it).
"""

from chamber.common.contracts.base import SCHEMA_VERSION, Contract, Event
from chamber.common.contracts.decisions import Decision, JobPlaced, JobStateChanged
from chamber.common.contracts.health import GpuHealthVerdict, HealthCommand, HealthState
from chamber.common.contracts.inventory import GpuDevice, Node, NodeInventory, Pool, TopologyLabels
from chamber.common.contracts.jobs import (
    TERMINAL_STATES,
    GpuRef,
    JobCancelRequested,
    JobEvent,
    JobFinished,
    JobRecord,
    JobSpec,
    JobStarted,
    JobState,
    JobStopped,
    JobSubmitted,
    Placement,
    Topology,
)
from chamber.common.contracts.metrics import FleetSnapshot, RollupPoint
from chamber.common.contracts.quota import (
    BudgetSpec,
    OrgConfig,
    OrgUsage,
    PoolConfig,
    QuotaConfig,
    QuotaState,
    TeamConfig,
    TeamQuota,
    TeamUsage,
)
from chamber.common.contracts.telemetry import (
    FaultInjection,
    GpuActivityView,
    GpuProcess,
    GpuSample,
    GpuXidEvent,
    NodeActivityView,
    NodeTelemetry,
    TelemetryActivityView,
    TelemetryEvent,
    XidEventView,
)

__all__ = [
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "Contract",
    "Decision",
    "Event",
    "FaultInjection",
    "FleetSnapshot",
    "GpuDevice",
    "GpuHealthVerdict",
    "GpuActivityView",
    "GpuRef",
    "GpuProcess",
    "GpuSample",
    "GpuXidEvent",
    "HealthCommand",
    "HealthState",
    "JobCancelRequested",
    "JobEvent",
    "JobFinished",
    "JobPlaced",
    "JobRecord",
    "JobSpec",
    "JobStarted",
    "JobState",
    "JobStateChanged",
    "JobStopped",
    "JobSubmitted",
    "Node",
    "NodeActivityView",
    "NodeInventory",
    "NodeTelemetry",
    "Placement",
    "Pool",
    "BudgetSpec",
    "OrgConfig",
    "OrgUsage",
    "PoolConfig",
    "QuotaConfig",
    "QuotaState",
    "RollupPoint",
    "TeamConfig",
    "TeamQuota",
    "TeamUsage",
    "TelemetryActivityView",
    "TelemetryEvent",
    "Topology",
    "TopologyLabels",
    "XidEventView",
]
