"""The node agent's contracts: what the process executor asks of an agent, and what the agent reports back.

Commands (launch, stop, logs) are NATS requests that the agent answers at once; the executor retries one that got
no answer. Reports (a replica started, exited, could not start) go to the REPLICAS stream with message ids
(`<job>:<attempt>:<replica>:<what>`), so a crash on either side loses none and a repeat is harmless. The agent's
status (its heartbeat, with the replicas it runs) lets the executor notice a lost agent and stop attempts that
nobody holds GPUs for any more.
"""

from typing import Annotated

import msgspec

from chamber.common.contracts.base import Contract, Event

LOG_CHUNK_MAX = 1024 * 1024
"""The most bytes of log one request returns."""


AgentJobId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}\Z")]
"""A job id in a request to an agent, as the gateway and the Kubernetes intake make them: it names a directory, a
NATS subject and log files on the node, so anything else is refused (found by review: a NUL in one stopped the
agent's heartbeat, a space made its reports unpublishable and held back every later replica's, an absolute path
read logs outside the agent's directory)."""
Count = Annotated[int, msgspec.Meta(ge=0)]


class ReplicaAssignment(Contract, frozen=True):
    """One replica of a gang, placed on this node: its rank and the indices of its GPUs on the node."""

    replica: Count
    gpus: list[Count]


class LaunchReplicas(Event, frozen=True):
    """Start these replicas of one attempt on the node (idempotent: a replica that exists is not started twice)."""

    job_id: AgentJobId
    attempt: Count
    replicas: int
    """The gang's size (`CHAMBER_REPLICAS`)."""
    assignments: list[ReplicaAssignment]
    command: list[str]
    env: dict[str, str] = msgspec.field(default_factory=dict)
    working_dir: str | None = None
    master_addr: str = ""
    """Where replica 0 runs; empty: this node hosts replica 0 and answers with its own address."""
    master_port: int = 0
    """0: this node hosts replica 0 and picks a free port, which it answers with."""


class StopReplicas(Event, frozen=True):
    """Stop every replica of this attempt on the node: SIGTERM to each process group, SIGKILL after `grace_s`."""

    job_id: AgentJobId
    attempt: Count
    grace_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    reason: str = ""
    replicas: list[int] = msgspec.field(default_factory=list)
    """The replicas placed on this node; one the agent never launched is marked so that it never starts."""


class AgentReply(Event, frozen=True):
    """The agent's answer to a launch or stop: accepted (the outcome follows as reports), or why not."""

    ok: bool
    error: str = ""
    master_addr: str = ""
    master_port: int = 0


class ReplicaStarted(Event, frozen=True):
    node: str
    job_id: str
    attempt: int
    replica: int
    pid: int
    started_at: float
    visible_devices: str = ""
    """The replica's `CUDA_VISIBLE_DEVICES`."""


class ReplicaExited(Event, frozen=True):
    """A replica's process ended: its exit code, or the signal that ended it."""

    node: str
    job_id: str
    attempt: int
    replica: int
    exited_at: float
    exit_code: int | None = None
    signal: int | None = None
    stop_requested: bool = False
    """The agent had been asked to stop it (the end of a preemption, a cancel or a failed gang)."""
    lost: bool = False
    """The agent found it gone without an exit status (its record was lost)."""
    message: str = ""
    fenced: bool = False
    """Stopped by its own dead-man switch: its agent was cut off from NATS (see the shim)."""


class ReplicaLaunchFailed(Event, frozen=True):
    node: str
    job_id: str
    attempt: int
    replica: int
    failed_at: float
    reason: str


ReplicaReport = ReplicaStarted | ReplicaExited | ReplicaLaunchFailed


class RunningReplica(Contract, frozen=True):
    job_id: str
    attempt: int
    replica: int
    pid: int
    gpus: list[int] = msgspec.field(default_factory=list)


class AgentStatus(Event, frozen=True):
    """An agent's heartbeat: alive, where it can be reached, and the replicas it runs."""

    node: str
    at: float
    started_at: float
    """When this agent process started (a new value: it restarted)."""
    address: str = ""
    """The host name or address gang peers use for `MASTER_ADDR`."""
    replicas: list[RunningReplica] = msgspec.field(default_factory=list)


class LogsRequest(Event, frozen=True):
    job_id: AgentJobId
    attempt: Count
    replica: Count = 0
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Bytes from the start of the replica's output (which survives rotation: older bytes are dropped, offsets
    stay)."""
    limit: Annotated[int, msgspec.Meta(ge=1, le=LOG_CHUNK_MAX)] = LOG_CHUNK_MAX


class LogsChunk(Event, frozen=True):
    node: str
    job_id: str
    attempt: int
    replica: int
    found: bool
    data: bytes = b""
    offset: int = 0
    """Where `data` starts (later than asked when older output was rotated away)."""
    next_offset: int = 0
    running: bool = False
    """The replica may still write more."""
