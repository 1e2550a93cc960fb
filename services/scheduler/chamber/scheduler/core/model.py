"""The scheduler core's working model of jobs: what a waiting job needs, what a running job holds."""

from dataclasses import dataclass, field, replace

from chamber.common.contracts import GpuRef, JobRecord
from chamber.common.priorities import DEFAULT_CLASSES, PriorityClass, priority_value
from chamber.scheduler.core.checkpoint import saved_work

TopologyLevel = str  # "node" | "rack" | "zone"


@dataclass(frozen=True, slots=True, eq=True)
class Shape:
    """Everything about a job that decides where it can go. Jobs of one shape fit or fail together."""

    per_replica: int
    replicas: int
    pool: str | None = None
    gpu_model: str | None = None
    level: TopologyLevel | None = None
    required: bool = True
    _hash: int = field(init=False, repr=False, compare=False, default=0)
    """The hash, computed once: a cycle with a thousand teams looks shapes up in sets and dicts ~10,000 times."""

    def __post_init__(self) -> None:
        fields = (self.per_replica, self.replicas, self.pool, self.gpu_model, self.level, self.required)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    @property
    def gpus(self) -> int:
        return self.per_replica * self.replicas

    def describe(self) -> str:
        where = ""
        if self.level is not None:
            where = f" in one {self.level}" + ("" if self.required else " (preferred)")
        constraint = "".join(f" of {c}" for c in (self.gpu_model, self.pool) if c)
        if self.replicas == 1:
            return f"{self.per_replica} GPUs{constraint}{where}"
        return f"{self.gpus} GPUs{constraint} ({self.replicas} x {self.per_replica}){where}"


def slot_of(ref: GpuRef) -> str:
    """`ref.slot`, compiled: the contract's property runs as interpreted Python, and a cycle asks it for every GPU
    it places."""
    return f"{ref.node}/{ref.index}"


def shape_of(record: JobRecord) -> Shape:
    s = record.spec
    topo = s.topology
    return Shape(
        per_replica=s.gpus_per_replica,
        replicas=s.replicas,
        pool=s.pool,
        gpu_model=s.gpu_model,
        level=topo.level if topo else None,
        required=topo.required if topo else True,
    )


@dataclass(slots=True)
class RunningJob:
    """A job that holds GPUs (running, or placed and starting)."""

    id: str
    team: str
    priority: int
    preemptible: bool
    gpus: tuple[GpuRef, ...]
    started_at: float
    min_runtime_s: float
    checkpoint_interval_s: float | None
    checkpoint_grace_s: float
    est_end: float | None
    """When it should end, from the user's `max_runtime_s` or its predicted runtime; None when unknown."""
    borrowed: bool = False
    """Runs on capacity borrowed beyond its team's quota (reclaimed first)."""
    stopping: bool = False
    attempt: int = 0
    pool: str = ""
    spread: tuple[tuple[str, int], ...] = ()
    """(node, GPUs held there) for every node it holds GPUs on: what stopping it frees, where (worked out from
    `gpus` when not given)."""
    at_once: bool = False
    """Stopping, and its stop kills it at once (a cancel, a fatal fault): no checkpoint grace left to cut."""

    def __init__(  # noqa: PLR0917 (the fields, positional as the dataclass's own `__init__` takes them)
        self,
        id: str,
        team: str,
        priority: int,
        preemptible: bool,
        gpus: tuple[GpuRef, ...],
        started_at: float,
        min_runtime_s: float,
        checkpoint_interval_s: float | None,
        checkpoint_grace_s: float,
        est_end: float | None,
        borrowed: bool = False,
        stopping: bool = False,
        attempt: int = 0,
        pool: str = "",
        spread: tuple[tuple[str, int], ...] = (),
        at_once: bool = False,
    ) -> None:
        # Its own `__init__`, not the one `dataclass` writes: compiled, that one runs as interpreted Python, ten
        # times slower (a cycle places ~200 jobs; see `chamber.scheduler.core`).
        self.id = id
        self.team = team
        self.priority = priority
        self.preemptible = preemptible
        self.gpus = gpus
        self.started_at = started_at
        self.min_runtime_s = min_runtime_s
        self.checkpoint_interval_s = checkpoint_interval_s
        self.checkpoint_grace_s = checkpoint_grace_s
        self.est_end = est_end
        self.borrowed = borrowed
        self.stopping = stopping
        self.attempt = attempt
        self.pool = pool
        if not spread:
            counts: dict[str, int] = {}
            for ref in gpus:
                counts[ref.node] = counts.get(ref.node, 0) + 1
            spread = tuple(counts.items())
        self.spread = spread
        self.at_once = at_once

    def work_lost_if_stopped(self, now: float) -> float:
        ran = max(0.0, now - self.started_at)
        return ran - saved_work(ran, self.checkpoint_interval_s, graceful=self.checkpoint_grace_s > 0)


def running_from(
    record: JobRecord, classes: dict[str, PriorityClass] = DEFAULT_CLASSES, borrowed: bool = False, pool: str = ""
) -> RunningJob:
    """The running job a record that holds GPUs describes: its current attempt, started when it started."""
    assert record.placement is not None
    started = record.started_at if record.started_at is not None else record.updated_at
    job = pending_from(record, classes).start(tuple(record.placement.gpus), started, pool=pool, borrowed=borrowed)
    job.attempt = record.attempt
    job.stopping = record.stopping
    job.at_once = record.cancel_requested or (record.stopping and record.stop_grace_s == 0)
    return job


@dataclass(slots=True)
class PendingJob:
    id: str
    team: str
    priority: int
    shape: Shape
    submitted_at: float
    preemptions: int
    attempt: int
    est_runtime_s: float | None
    """What is left of the user's `max_runtime_s`; None when unknown."""
    preemptible: bool = True
    min_runtime_s: float = 0.0
    checkpoint_interval_s: float | None = None
    checkpoint_grace_s: float = 0.0
    nominated: tuple[GpuRef, ...] = ()
    waiting_for: tuple[str, ...] = ()
    """While nominated: the victims it waits for, `job/attempt` (besides whoever holds its nominated GPUs)."""
    name: str = ""
    run_s: float = 0.0
    """Work done in earlier attempts (what least-attained-service orders by)."""
    predicted_s: float | None = None
    """What is left of its predicted runtime, learned from finished jobs like it (set when it is queued)."""
    backfill_on_prediction: bool = False
    """Whether backfill may trust `predicted_s` (the scheduler's `backfill_on_predictions`)."""
    aged: bool = False
    """It has waited longer than the scheduler's `max_wait_s`: it goes ahead of its priority peers."""

    @property
    def estimate(self) -> float | None:
        """How long it should run if placed now, for backfill: the user's bound, or the smaller of it and the
        prediction where backfill trusts predictions."""
        user = self.est_runtime_s
        predicted = self.predicted_s if self.backfill_on_prediction else None
        if user is None:
            return predicted
        return user if predicted is None else min(user, predicted)

    def requeued(self, attempt: int, saved_s: float) -> "PendingJob":
        """The job back in the queue after attempt `attempt` was preempted, `saved_s` of its work checkpointed."""
        est = None if self.est_runtime_s is None else max(0.0, self.est_runtime_s - saved_s)
        return replace(
            self, attempt=attempt, preemptions=self.preemptions + 1, est_runtime_s=est, nominated=(), waiting_for=(),
            run_s=self.run_s + saved_s, predicted_s=None, aged=False,
        )  # fmt: skip

    def start(self, gpus: tuple[GpuRef, ...], now: float, pool: str = "", borrowed: bool = False) -> RunningJob:
        """The running job this becomes when placed on `gpus` at `now`."""
        return RunningJob(
            id=self.id,
            team=self.team,
            priority=self.priority,
            preemptible=self.preemptible,
            gpus=gpus,
            started_at=now,
            min_runtime_s=self.min_runtime_s,
            checkpoint_interval_s=self.checkpoint_interval_s,
            checkpoint_grace_s=self.checkpoint_grace_s,
            est_end=None if self.estimate is None else now + self.estimate,
            attempt=self.attempt + 1,
            pool=pool,
            borrowed=borrowed,
        )


def pending_from(record: JobRecord, classes: dict[str, PriorityClass] = DEFAULT_CLASSES) -> PendingJob:
    spec = record.spec
    est = None if spec.max_runtime_s is None else max(0.0, spec.max_runtime_s - record.run_s)
    pc = classes.get(spec.priority)
    return PendingJob(
        id=record.id,
        team=spec.team,
        priority=priority_value(spec.priority, classes),
        shape=shape_of(record),
        submitted_at=record.submitted_at,
        preemptions=record.preemptions,
        attempt=record.attempt,
        est_runtime_s=est,
        preemptible=spec.preemptible if spec.preemptible is not None else (pc.preemptible if pc else True),
        min_runtime_s=spec.min_runtime_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        checkpoint_grace_s=spec.checkpoint_grace_s,
        nominated=tuple(record.nominated),
        waiting_for=tuple(record.waiting_for),
        name=spec.name,
        run_s=record.run_s,
    )
