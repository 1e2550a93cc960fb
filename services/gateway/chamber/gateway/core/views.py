"""API response shapes and the pure functions that compute them."""

from collections.abc import Iterable, Mapping

import msgspec

from chamber.common.contracts import (
    FleetSnapshot,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    Node,
    NodeTelemetry,
    Placement,
)


class JobView(msgspec.Struct, kw_only=True):
    id: str
    name: str
    team: str
    state: JobState
    reason: str
    priority: str
    gpus_per_replica: int
    replicas: int
    gpus: int
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int = 0
    placement: Placement | None = None
    preemptions: int = 0
    duration_s: float | None = None
    cancel_requested: bool = False
    run_s: float = 0.0
    lost_s: float = 0.0
    interruptions: int = 0
    nominated: list[GpuRef] = msgspec.field(default_factory=list)


class NodeView(msgspec.Struct, kw_only=True):
    name: str
    pool: str
    gpu_model: str
    zone: str
    rack: str
    gpus_total: int
    gpus_allocated: int
    gpus_unschedulable: int
    unschedulable: dict[str, str]
    """GPU index -> reason."""


class FleetView(msgspec.Struct, kw_only=True):
    nodes: int
    gpus_total: int
    gpus_allocated: int
    gpus_unschedulable: int
    gpus_free: int
    allocation_ratio: float
    queue_depth: int
    jobs_running: int
    gpus_healthy: int | None = None
    utilization: float | None = None
    idle_ratio: float | None = None
    efficiency_score: float | None = None
    idle_cost_per_hour: float | None = None
    spend_per_hour: float | None = None
    metrics_at: float | None = None
    """When the collector computed the telemetry-based fields (None: no telemetry yet)."""


def job_view(record: JobRecord) -> JobView:
    s = record.spec
    return JobView(
        id=record.id,
        name=s.name,
        team=s.team,
        state=record.state,
        reason=record.reason,
        priority=s.priority,
        gpus_per_replica=s.gpus_per_replica,
        replicas=s.replicas,
        gpus=s.gpus,
        submitted_at=record.submitted_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        attempt=record.attempt,
        placement=record.placement,
        preemptions=record.preemptions,
        duration_s=s.duration_s,
        cancel_requested=record.cancel_requested,
        run_s=record.run_s,
        lost_s=record.lost_s,
        interruptions=record.interruptions,
        nominated=record.nominated,
    )


def submitted_view(job_id: str, spec: JobSpec, submitted_at: float) -> JobView:
    """A job the gateway accepted but the scheduler has not recorded yet."""
    record = JobRecord(
        id=job_id,
        spec=spec,
        state=JobState.PENDING,
        submitted_at=submitted_at,
        updated_at=submitted_at,
        reason="submitted",
    )
    return job_view(record)


def node_views(nodes: Iterable[Node], owners: Mapping[str, str], cordoned: Mapping[str, str]) -> list[NodeView]:
    views = []
    for node in sorted(nodes, key=lambda n: n.name):
        slots = [f"{node.name}/{g.index}" for g in node.gpus]
        bad = {slot.rsplit("/", 1)[1]: cordoned[slot] for slot in slots if slot in cordoned}
        views.append(
            NodeView(
                name=node.name,
                pool=node.pool,
                gpu_model=node.gpus[0].model if node.gpus else "",
                zone=node.topology.zone,
                rack=node.topology.rack,
                gpus_total=len(slots),
                gpus_allocated=sum(slot in owners for slot in slots),
                gpus_unschedulable=len(bad),
                unschedulable=bad,
            )
        )
    return views


def fleet_view(nodes: list[NodeView], records: Iterable[JobRecord], metrics: FleetSnapshot | None = None) -> FleetView:
    total = sum(n.gpus_total for n in nodes)
    allocated = sum(n.gpus_allocated for n in nodes)
    unschedulable = sum(n.gpus_unschedulable for n in nodes)
    queue = running = 0
    for r in records:
        if r.state in (JobState.PENDING, JobState.PREEMPTED):
            queue += 1
        elif r.state == JobState.RUNNING:
            running += 1
    return FleetView(
        nodes=len(nodes),
        gpus_total=total,
        gpus_allocated=allocated,
        gpus_unschedulable=unschedulable,
        gpus_free=max(0, total - allocated - unschedulable),
        allocation_ratio=round(allocated / total, 4) if total else 0.0,
        queue_depth=queue,
        jobs_running=running,
        gpus_healthy=None if metrics is None else metrics.gpus_healthy,
        utilization=None if metrics is None else metrics.utilization,
        idle_ratio=None if metrics is None else metrics.idle_ratio,
        efficiency_score=None if metrics is None else metrics.efficiency_score,
        idle_cost_per_hour=None if metrics is None else metrics.idle_cost_per_hour,
        spend_per_hour=None if metrics is None else metrics.spend_per_hour,
        metrics_at=None if metrics is None else metrics.at,
    )


class GpuCell(msgspec.Struct, kw_only=True):
    index: int
    util: float | None = None
    """Percent of time a kernel ran, from the node's latest telemetry (None: not reporting)."""
    mem_util: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    allocated_to: str | None = None
    unschedulable: str | None = None
    """Why it may not be claimed (a quarantine, an operator cordon)."""


class NodeHeat(msgspec.Struct, kw_only=True):
    name: str
    pool: str
    rack: str
    sampled_at: float | None
    """When the node last reported (None: never, or it went silent)."""
    gpus: list[GpuCell]


def heatmap(
    nodes: Iterable[Node],
    telemetry: Mapping[str, NodeTelemetry],
    owners: Mapping[str, str],
    cordoned: Mapping[str, str],
) -> list[NodeHeat]:
    """Every GPU of every node with its latest reading, holder and schedulability, nodes by name."""
    out = []
    for node in sorted(nodes, key=lambda n: n.name):
        batch = telemetry.get(node.name)
        samples = {s.index: s for s in batch.gpus} if batch is not None else {}
        cells = []
        for g in node.gpus:
            slot = f"{node.name}/{g.index}"
            s = samples.get(g.index)
            holder = owners.get(slot)
            cells.append(
                GpuCell(
                    index=g.index,
                    util=s.gpu_util if s else None,
                    mem_util=s.mem_util if s else None,
                    temperature_c=s.temperature_c if s else None,
                    power_w=s.power_w if s else None,
                    allocated_to=holder.rsplit("/", 1)[0] if holder else None,
                    unschedulable=cordoned.get(slot),
                )
            )
        out.append(NodeHeat(name=node.name, pool=node.pool, rack=node.topology.rack,
                            sampled_at=batch.sampled_at if batch else None, gpus=cells))  # fmt: skip
    return out
