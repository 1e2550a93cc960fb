"""The event contracts every service speaks, in one place.

All messages on the bus are msgspec Structs encoded as JSON. Each top-level event carries a `kind` tag (so a
stream can hold a tagged union) and a schema version `v`. Evolution rule: a field added after version 1 must
have a default, so old messages still decode (tests/contracts/test_schema_evolution.py enforces it).
"""

from chamber.common.contracts.agent import (
    AgentReply,
    AgentStatus,
    LaunchReplicas,
    LogsChunk,
    LogsRequest,
    ReplicaAssignment,
    ReplicaExited,
    ReplicaLaunchFailed,
    ReplicaReport,
    ReplicaStarted,
    RunningReplica,
    StopReplicas,
)
from chamber.common.contracts.audit import AuditRecord
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
    JobLaunchFailed,
    JobRecord,
    JobSpec,
    JobStarted,
    JobState,
    JobStopped,
    JobSubmitted,
    Placement,
    Topology,
    WorkloadRef,
)
from chamber.common.contracts.ledger import Cordon, Severity
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
from chamber.common.contracts.scheduler import SchedulerStats
from chamber.common.contracts.telemetry import (
    FaultInjection,
    GpuProcess,
    GpuSample,
    GpuXidEvent,
    NodeTelemetry,
    TelemetryEvent,
)

__all__ = [
    "SCHEMA_VERSION",
    "AuditRecord",
    "TERMINAL_STATES",
    "AgentReply",
    "AgentStatus",
    "Contract",
    "Cordon",
    "Decision",
    "Event",
    "FaultInjection",
    "FleetSnapshot",
    "GpuDevice",
    "GpuHealthVerdict",
    "GpuRef",
    "GpuProcess",
    "GpuSample",
    "GpuXidEvent",
    "HealthCommand",
    "HealthState",
    "JobCancelRequested",
    "JobEvent",
    "JobFinished",
    "JobLaunchFailed",
    "JobPlaced",
    "JobRecord",
    "JobSpec",
    "JobStarted",
    "JobState",
    "JobStateChanged",
    "JobStopped",
    "JobSubmitted",
    "LaunchReplicas",
    "LogsChunk",
    "LogsRequest",
    "Node",
    "NodeInventory",
    "NodeTelemetry",
    "Placement",
    "Pool",
    "Severity",
    "StopReplicas",
    "BudgetSpec",
    "OrgConfig",
    "OrgUsage",
    "PoolConfig",
    "QuotaConfig",
    "QuotaState",
    "ReplicaAssignment",
    "ReplicaExited",
    "ReplicaLaunchFailed",
    "ReplicaReport",
    "ReplicaStarted",
    "RunningReplica",
    "RollupPoint",
    "SchedulerStats",
    "TeamConfig",
    "TeamQuota",
    "TeamUsage",
    "TelemetryEvent",
    "Topology",
    "TopologyLabels",
    "WorkloadRef",
]
