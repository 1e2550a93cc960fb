"""Fleet metrics, computed continuously from the latest sample of every GPU (definitions: docs/metrics.md).

`FleetMetrics.ingest` keeps the last sample per GPU (cheap: it runs for every sample). `snapshot` joins those
samples with allocation (ledger), health (cordons), prices (pools) and the queue, integrates the time since the
previous snapshot into GPU-hour counters, and returns the fleet's numbers. Pure: the time comes in as an argument.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from chamber.common.contracts import FleetSnapshot, GpuSample, NodeTelemetry

IDLE_POWER_SHARE = 0.10
"""A GPU drawing under 10% of its power limit counts as idle, whatever its utilization counter says."""
STALE_INTERVALS = 3


@dataclass(slots=True)
class GpuReading:
    node: str
    sample: GpuSample
    sampled_at: float
    interval_s: float


@dataclass(frozen=True, slots=True)
class PoolPrice:
    pool: str
    cloud: str
    cost_per_gpu_hour: float


def activity(sample: GpuSample) -> float:
    """0..1: how busy the GPU is (its GPM usage when offered, else utilization), 0 when it draws idle power."""
    if sample.usage is not None:
        return max(0.0, min(1.0, sample.usage / 100))
    if sample.power_w is not None and sample.power_limit_w and sample.power_w < IDLE_POWER_SHARE * sample.power_limit_w:
        return 0.0
    if sample.sm_activity is not None:
        return max(0.0, min(1.0, sample.sm_activity))
    if sample.gpu_util is not None:
        return max(0.0, min(1.0, sample.gpu_util / 100))
    return 0.0


@dataclass
class FleetMetrics:
    readings: dict[str, GpuReading] = field(default_factory=dict)
    """slot (`node/index`) -> the latest reading."""
    idle_seconds_by_team: dict[str, float] = field(default_factory=dict)
    idle_seconds_by_job: dict[str, float] = field(default_factory=dict)
    last_at: float | None = None
    samples: int = 0

    def ingest(self, batch: NodeTelemetry) -> None:
        node = batch.node
        for s in batch.gpus:
            self.readings[f"{node}/{s.index}"] = GpuReading(node, s, batch.sampled_at, batch.interval_s)
        self.samples += len(batch.gpus)

    def snapshot(
        self,
        now: float,
        *,
        inventory: Iterable[tuple[str, str]],
        allocation: Mapping[str, tuple[str, str]],
        cordoned: Iterable[str],
        prices: Mapping[str, PoolPrice],
        queue: Iterable[tuple[str, str]],
    ) -> FleetSnapshot:
        """`inventory`: (slot, pool) of every GPU; `allocation`: slot -> (job, team); `queue`: (team, priority)."""
        bad = set(cordoned)
        dt = 0.0 if self.last_at is None else max(0.0, now - self.last_at)
        self.last_at = now
        total = healthy = allocated = reporting = 0
        busy_sum = useful = 0.0
        idle_slots = 0
        spend_pool: dict[str, float] = {}
        idle_pool: dict[str, float] = {}
        spend_cloud: dict[str, float] = {}
        for slot, pool in inventory:
            total += 1
            reading = self.readings.get(slot)
            fresh = reading is not None and now - reading.sampled_at <= STALE_INTERVALS * reading.interval_s
            reporting += fresh
            if slot in bad or not fresh:
                continue
            assert reading is not None
            healthy += 1
            act = activity(reading.sample)
            busy_sum += act
            price = prices.get(pool)
            cost = price.cost_per_gpu_hour if price else 0.0
            owner = allocation.get(slot)
            if owner is not None:
                allocated += 1
                useful += act
                spend_pool[pool] = spend_pool.get(pool, 0.0) + cost
                cloud = price.cloud if price else "local"
                spend_cloud[cloud] = spend_cloud.get(cloud, 0.0) + cost
            if owner is None or act == 0.0:
                idle_slots += 1
                idle_pool[pool] = idle_pool.get(pool, 0.0) + cost
                if owner is not None and dt:
                    job, team = owner
                    self.idle_seconds_by_job[job] = self.idle_seconds_by_job.get(job, 0.0) + dt
                    self.idle_seconds_by_team[team] = self.idle_seconds_by_team.get(team, 0.0) + dt
        by_team: dict[str, int] = {}
        by_priority: dict[str, int] = {}
        depth = 0
        for team, priority in queue:
            depth += 1
            by_team[team] = by_team.get(team, 0) + 1
            by_priority[priority] = by_priority.get(priority, 0) + 1
        return FleetSnapshot(
            at=now, gpus_total=total, gpus_healthy=healthy, gpus_allocated=allocated, gpus_reporting=reporting,
            utilization=_ratio(busy_sum, healthy), allocation_ratio=_ratio(allocated, healthy),
            idle_ratio=_ratio(idle_slots, healthy), efficiency_score=round(100 * _ratio(useful, healthy), 2),
            idle_cost_per_hour=round(sum(idle_pool.values()), 4), spend_per_hour=round(sum(spend_pool.values()), 4),
            queue_depth=depth, queue_by_team=by_team, queue_by_priority=by_priority,
            spend_per_hour_by_pool=spend_pool, idle_spend_per_hour_by_pool=idle_pool,
            spend_per_hour_by_cloud=spend_cloud,
            allocated_idle_gpu_hours_by_team={t: round(s / 3600, 4) for t, s in self.idle_seconds_by_team.items()},
            allocated_idle_gpu_hours_by_job={j: round(s / 3600, 4) for j, s in self.idle_seconds_by_job.items()},
        )  # fmt: skip


def _ratio(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0
