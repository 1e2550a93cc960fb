"""What the scheduler reports about itself: how long deciding takes, how much waits and runs, its memory."""

from chamber.common.contracts.base import Event


class SchedulerStats(Event, frozen=True):
    """Published by the scheduler leader every second (`metrics.scheduler`)."""

    at: float
    holder: str
    """The leader's identity (`scheduler@host:pid`)."""
    token: int
    """Its fencing token."""
    decisions: int
    """Decision passes since the last report."""
    decide_p50_ms: float
    decide_p99_ms: float
    """Time to decide, per pass (a full cycle or the arrivals since the last one), over the last report."""
    apply_p99_ms: float
    """Time to apply a pass's decisions (ledger claims, records, publishes), over the last report."""
    placed: int
    waiting: int
    running: int
    rss_mb: float
    quota_at: float | None = None
    """`computed_at` of the quota state (usage, standings, budget blocks) the leader decides under from now on; None
    before the quota service published one. Far behind `at`, the scheduler acts on a stale view of budgets and
    fair share (the quota service is down, or its state does not reach the scheduler)."""
