"""The fleet metrics kept in rollups (and served by `GET /v1/fleet/history`); defined in docs/metrics.md."""

METRICS = (
    "utilization",
    "allocation_ratio",
    "idle_ratio",
    "efficiency_score",
    "idle_cost_per_hour",
    "spend_per_hour",
    "queue_depth",
    "gpus_healthy",
    "gpus_allocated",
    "gpus_activity_unknown",
)
