"""Jobs: what users submit, the lifecycle events about them, and the record the scheduler keeps.

The job state machine (see docs/architecture.md):
pending -> running -> succeeded | failed; pending | running -> cancelled; running -> preempted -> running.
A placed job whose executor has not yet reported its start stays `pending` with a `placement`.
"""

from enum import StrEnum
from typing import Annotated, Literal

import msgspec

from chamber.common.contracts.base import Contract, Event

JobName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$(?!\n)")]
TeamName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$(?!\n)")]
"""`(?!\n)`: Python's `$` also matches before a final newline; JSON Schema readers see the same pattern."""


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Topology(Contract, frozen=True):
    """Keep a gang's replicas together: on one node, in one rack (NVLink domain), or in one zone."""

    level: Literal["node", "rack", "zone"]
    required: bool = True
    """Required: wait until it fits so. Preferred: so if possible, else anywhere."""


EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
"""A variable name; its shape (`[A-Za-z_][A-Za-z0-9_]*`) is checked by `chamber.common.workload`, which can say
which name is wrong (a decoder cannot point at a dictionary key)."""
Argv = Annotated[list[Annotated[str, msgspec.Meta(max_length=65536)]], msgspec.Meta(min_length=1, max_length=4096)]
EnvVars = Annotated[dict[EnvName, Annotated[str, msgspec.Meta(max_length=65536)]], msgspec.Meta(max_length=1024)]
MAX_SPEC_BYTES = 256 * 1024
"""A job's spec, encoded, is at most this large (the gateway refuses a larger one with 413). The limits of each
field above allow far more in sum, but the spec travels inside messages NATS caps at 1 MiB (the submit event,
the job record in the KV with its placement, the launch request to a node agent): a spec that fits a submit but
not the record was acknowledged and then could never be written, so the job never ran."""
WorkingDir = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
Image = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class WorkloadRef(Contract, frozen=True):
    """The Kubernetes object a job stands for (a suspended `batch/v1` Job, a JobSet, a PyTorchJob ...)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


MAX_SECONDS = 10 * 365 * 86400
"""The longest time a job's spec may name (ten years): above it a time is a mistake, and infinity, which msgspec
would take and then write as `null`, could not be read back (a Kubernetes Job annotated `inf` was taken by the
webhook and then refused by the scheduler's decoder: lost)."""


Timestamp = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]
"""A time in a job event (seconds since the epoch, or of a simulated clock), within ~30,000 years of 1970: a
report with an absurd one (1.7e308) was taken, made its job's run time infinite, and the record written with it
(infinity is written as null) could not be read back: the job was lost (found by review)."""


class JobSpec(Contract, frozen=True, omit_defaults=True):
    """A job as submitted: a gang of `replicas`, each needing `gpus_per_replica` GPUs on one node.

    What runs: `command` (+ `env`, `working_dir`, `image`) for the process executor, `workload` for Kubernetes,
    `duration_s` for the simulated executor (which only pretends to run it).

    Fields at their default are left out when encoded (as in `JobRecord`); a decoder fills them in again.
    """

    name: JobName
    team: TeamName
    gpus_per_replica: Annotated[int, msgspec.Meta(ge=1, le=64)]
    replicas: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 1
    priority: str = "train"
    duration_s: Annotated[float, msgspec.Meta(ge=0, le=365 * 86400)] | None = None
    max_runtime_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] | None = None
    min_runtime_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)] = 0.0
    checkpoint_grace_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)] = 0.0
    pool: str | None = None
    gpu_model: str | None = None
    topology: Topology | None = None
    checkpoint_interval_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] | None = None
    """How often the job checkpoints; None: it checkpoints when told to stop, if given a grace period."""
    requeue: Literal["always", "never"] = "always"
    """After a preemption or interruption: back to the queue (resuming from its checkpoint) or fail."""
    command: Argv | None = None
    """argv of each replica's process (process executor); None: nothing to run (simulated or Kubernetes)."""
    env: EnvVars = msgspec.field(default_factory=dict)
    working_dir: WorkingDir | None = None
    image: Image | None = None
    """A container image, for container runtimes (not used by the process executor yet)."""
    preemptible: bool | None = None
    """None: as its priority class says. True: this job may be preempted (and may borrow idle quota) even in a
    class that is not preempted by default; False: never preempted."""
    workload: WorkloadRef | None = None
    """The Kubernetes workload this job stands for (set by Chamber's Kubernetes intake, not by users)."""

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


class GpuRef(Contract, frozen=True, array_like=True):
    """One GPU slot: a node name and the GPU's index on it. Encoded as `["node", index]`."""

    node: str
    index: int

    @property
    def slot(self) -> str:
        return f"{self.node}/{self.index}"


class Placement(Contract, frozen=True):
    """Where one attempt of a job runs: all GPUs of the gang, replica by replica."""

    attempt: int
    gpus: list[GpuRef]
    reason: str = ""


class JobRecord(Contract, frozen=True, omit_defaults=True):
    """The scheduler's record of a job; the durable copy lives in the jobs KV bucket, keyed by id.

    Fields at their default are left out when encoded: a record is written to the KV and announced on DECISIONS
    at every transition and read by three services, and most of its fields are empty for most of its life (a
    running one-GPU job's record: 370 bytes of JSON instead of ~900; the e2e benchmark's CPU per job
    fell ~9%). Decoders fill them in again, so readers see no difference."""

    id: str
    spec: JobSpec
    state: JobState
    submitted_at: float
    updated_at: float
    version: int = 1
    attempt: int = 0
    placement: Placement | None = None
    started_at: float | None = None
    finished_at: float | None = None
    run_s: float = 0.0
    reason: str = ""
    preemptions: int = 0
    cancel_requested: bool = False
    nominated: list[GpuRef] = msgspec.field(default_factory=list)
    """GPUs set aside for this job while the jobs it preempted stop; nobody else may take them."""
    waiting_for: list[str] = msgspec.field(default_factory=list)
    """While nominated: the attempts preempted for it that it waits for, as `job/attempt`."""
    stopping: bool = False
    """The executor was asked to stop the current attempt (preemption or interruption) and has not confirmed yet."""
    move_to: list[GpuRef] = msgspec.field(default_factory=list)
    """Moved to open room for another job (consolidation): the free GPUs held for its next attempt, which starts
    on them as soon as this one has stopped. Kept in the record so that a scheduler restarted in between still
    holds them for it; cleared when it is placed again."""
    stop_reason: str = ""
    stop_kind: Literal["", "preempt", "interrupt"] = ""
    stop_grace_s: float | None = None
    """The checkpoint grace the stop granted (0 for a fatal interruption; the job's own for a preemption or a
    degraded GPU's drain); an executor restarted during it gives the job what is left of it. None: a record from
    before this was kept (a preemption then had the job's grace, an interruption none)."""
    lost_s: float = 0.0
    """Run time lost to preemptions and interruptions (work done after the last checkpoint)."""
    interruptions: int = 0
    launch_failures: int = 0
    """Launches of this job that failed in a row (the job fails after `MAX_LAUNCH_FAILURES`)."""
    reason_kind: str = ""
    """The kind of `reason` while the job waits (`queued`, `capacity`, `reserved`, `quota`, `budget`,
    `preempting`, `unschedulable`); empty otherwise. The API adds live numbers to waiting reasons on read."""
    stopped_at: float | None = None
    """When its last attempt stopped without ending the job (a preemption or interruption that requeued it): where
    its run time so far ends, for budget periods and decayed usage. `updated_at` is no stand-in: a waiting job's
    record is written again whenever its reason changes. None: never stopped so, or a record from before this."""


class JobSubmitted(Event, frozen=True):
    job_id: str
    spec: JobSpec
    submitted_at: Timestamp


class JobCancelRequested(Event, frozen=True):
    job_id: str
    requested_at: Timestamp


class JobStarted(Event, frozen=True):
    """The executor reports that an attempt started running."""

    job_id: str
    attempt: int
    started_at: Timestamp


class JobFinished(Event, frozen=True):
    """The executor reports that an attempt ran to its end."""

    job_id: str
    attempt: int
    finished_at: Timestamp
    succeeded: bool = True
    message: str = ""
    started_at: Timestamp | None = None
    """When the attempt started, so its run time is counted even if the start report was never applied."""
    exit_code: int | None = None


class JobStopped(Event, frozen=True):
    """The executor reports that it stopped an attempt it was asked to stop (cancel or preemption)."""

    job_id: str
    attempt: int
    stopped_at: Timestamp
    reason: str = ""
    graceful: bool = True
    """The job had its checkpoint grace period (False: killed at once, e.g. its GPU failed)."""
    started_at: Timestamp | None = None
    """When the attempt started (see JobFinished.started_at)."""
    interrupted: bool = False
    """Stopped by a failure (its GPU or node died), not on request: counted as an interruption."""


class JobLaunchFailed(Event, frozen=True):
    """The executor could not start an attempt (bad spec for the runtime, node gone, start deadline passed): the
    claim is released and the job waits again, or fails after too many failed launches."""

    job_id: str
    attempt: int
    failed_at: Timestamp
    reason: str


JobEvent = JobSubmitted | JobCancelRequested | JobStarted | JobFinished | JobStopped | JobLaunchFailed
