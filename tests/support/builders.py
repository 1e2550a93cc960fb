"""Fluent builders for scenario tables: `make_node("n1").gpus(8).rack("r1").build()`, `make_job("a")...`."""

from dataclasses import dataclass, field, replace
from typing import Literal

from chamber.common.contracts import (
    Cordon,
    GpuDevice,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    Node,
    OrgConfig,
    Placement,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
    Topology,
    TopologyLabels,
)
from chamber.common.quota import QuotaBook, validate


def pool_quota(capacity: int, *teams: tuple[str, str, int, int | None]) -> QuotaBook:
    """A quota book for one pool ("default", H100 GPUs) of `capacity` GPUs; teams as (name, cohort, nominal,
    borrowing limit)."""
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name="default", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[
                TeamConfig(name=name, org="org", cohort=cohort,
                           quotas=[TeamQuota(pool="default", nominal=nominal, borrowing_limit=limit)])
                for name, cohort, nominal, limit in teams
            ],
        ),
        capacity={"default": capacity},
    )  # fmt: skip


@dataclass(frozen=True)
class NodeBuilder:
    name: str
    n_gpus: int = 8
    pool_name: str = "default"
    model: str = "H100"
    rack_name: str = "rack-0"
    zone_name: str = "zone-a"

    def model_name(self, model: str) -> "NodeBuilder":
        return replace(self, model=model)

    def zone(self, zone: str) -> "NodeBuilder":
        return replace(self, zone_name=zone)

    def gpus(self, n: int) -> "NodeBuilder":
        return replace(self, n_gpus=n)

    def pool(self, pool: str) -> "NodeBuilder":
        return replace(self, pool_name=pool)

    def rack(self, rack: str) -> "NodeBuilder":
        return replace(self, rack_name=rack)

    def build(self) -> Node:
        return Node(
            name=self.name,
            pool=self.pool_name,
            gpus=[GpuDevice(index=i, uuid=f"GPU-{self.name}-{i}", model=self.model) for i in range(self.n_gpus)],
            topology=TopologyLabels(zone=self.zone_name, rack=self.rack_name, nvlink_domain=self.name),
        )


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


@dataclass(frozen=True)
class JobBuilder:
    id: str
    team_name: str = "team-a"
    per_replica: int = 1
    n_replicas: int = 1
    priority_name: str = "train"
    submitted: float = 0.0
    state_value: JobState = JobState.PENDING
    attempt_no: int = 0
    gpus_held: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    duration: float | None = 10.0
    pool_name: str | None = None
    model: str | None = None
    max_runtime: float | None = None
    min_runtime: float = 0.0
    grace: float = 0.0
    checkpoint_every: float | None = None
    topo: Topology | None = None
    started: float | None = None
    preempted_times: int = 0
    nominated_gpus: tuple[tuple[str, int], ...] = ()
    is_stopping: bool = False
    job_name: str | None = None
    run: float = 0.0

    def ran(self, seconds: float) -> "JobBuilder":
        """Work done in earlier attempts."""
        return replace(self, run=seconds)

    def named(self, name: str) -> "JobBuilder":
        """The job's name (default: its id): what the runtime predictor matches history by."""
        return replace(self, job_name=name)

    def estimate(self, seconds: float) -> "JobBuilder":
        return replace(self, max_runtime=seconds)

    def min_runtime_s(self, seconds: float) -> "JobBuilder":
        return replace(self, min_runtime=seconds)

    def grace_s(self, seconds: float) -> "JobBuilder":
        return replace(self, grace=seconds)

    def checkpoint(self, every: float) -> "JobBuilder":
        return replace(self, checkpoint_every=every)

    def gpu_model(self, model: str) -> "JobBuilder":
        return replace(self, model=model)

    def topology(self, level: Literal["node", "rack", "zone"], required: bool = True) -> "JobBuilder":
        return replace(self, topo=Topology(level=level, required=required))

    def started_at(self, t: float) -> "JobBuilder":
        return replace(self, started=t)

    def preempted(self, times: int) -> "JobBuilder":
        return replace(self, preempted_times=times, state_value=JobState.PREEMPTED)

    def nominated(self, *gpus: tuple[str, int]) -> "JobBuilder":
        return replace(self, nominated_gpus=gpus)

    def stopping(self) -> "JobBuilder":
        return replace(self, is_stopping=True)

    def team(self, team: str) -> "JobBuilder":
        return replace(self, team_name=team)

    def gpus(self, per_replica: int, replicas: int = 1) -> "JobBuilder":
        return replace(self, per_replica=per_replica, n_replicas=replicas)

    def priority(self, name: str) -> "JobBuilder":
        return replace(self, priority_name=name)

    def at(self, submitted: float) -> "JobBuilder":
        return replace(self, submitted=submitted)

    def pool(self, pool: str) -> "JobBuilder":
        return replace(self, pool_name=pool)

    def running_on(self, *gpus: tuple[str, int], attempt: int = 1) -> "JobBuilder":
        return replace(self, state_value=JobState.RUNNING, gpus_held=gpus, attempt_no=attempt)

    def spec(self) -> JobSpec:
        return JobSpec(
            name=self.job_name or self.id,
            team=self.team_name,
            gpus_per_replica=self.per_replica,
            replicas=self.n_replicas,
            priority=self.priority_name,
            duration_s=self.duration,
            pool=self.pool_name,
            gpu_model=self.model,
            max_runtime_s=self.max_runtime,
            min_runtime_s=self.min_runtime,
            checkpoint_grace_s=self.grace,
            checkpoint_interval_s=self.checkpoint_every,
            topology=self.topo,
        )

    def build(self) -> JobRecord:
        placement = None
        if self.gpus_held:
            placement = Placement(attempt=self.attempt_no, gpus=[GpuRef(n, i) for n, i in self.gpus_held])
        return JobRecord(
            id=self.id,
            spec=self.spec(),
            state=self.state_value,
            submitted_at=self.submitted,
            updated_at=self.submitted,
            attempt=self.attempt_no,
            placement=placement,
            started_at=(self.started if self.started is not None else self.submitted) if placement else None,
            preemptions=self.preempted_times,
            nominated=[GpuRef(n, i) for n, i in self.nominated_gpus],
            stopping=self.is_stopping,
            run_s=self.run,
        )


def make_job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


def fatal(reason: str) -> Cordon:
    return Cordon(severity="fatal", reason=reason)


def degraded(reason: str) -> Cordon:
    return Cordon(severity="degraded", reason=reason)
