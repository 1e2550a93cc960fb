"""Fleet metrics as published by the collector's aggregator, for the gateway and the dashboard."""

from chamber.common.contracts.base import Event


class FleetSnapshot(Event, frozen=True):
    """The fleet's numbers at one moment (definitions in docs/metrics.md)."""

    at: float
    gpus_total: int
    gpus_healthy: int
    gpus_allocated: int
    gpus_reporting: int
    utilization: float
    allocation_ratio: float
    idle_ratio: float
    efficiency_score: float
    idle_cost_per_hour: float
    spend_per_hour: float
    queue_depth: int
    queue_by_team: dict[str, int]
    queue_by_priority: dict[str, int]
    spend_per_hour_by_pool: dict[str, float]
    idle_spend_per_hour_by_pool: dict[str, float]
    spend_per_hour_by_cloud: dict[str, float]
    allocated_idle_gpu_hours_by_team: dict[str, float]
    allocated_idle_gpu_hours_by_job: dict[str, float]
    gpus_activity_unknown: int = 0
    """Healthy GPUs held by a job whose source tells no activity (no usage, SM activity or utilization, nor idle
    power): left out of `utilization` and `efficiency_score`, and never counted idle."""


class RollupPoint(Event, frozen=True):
    """The mean of one metric set over one bucket (1m, 1h or 1d)."""

    resolution: str
    start: float
    values: dict[str, float]
    samples: int
