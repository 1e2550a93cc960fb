"""May this job start now, and where, as far as team quotas and budgets are concerned?

With quotas on, a job may go only to pools its team's quota admits it to (within nominal first, then borrowing);
a refusal says why. A team's own higher-priority work always comes before its own lower-priority work: when the
team's quota in a pool is full, a job may still be admitted by displacing the team's own lower-priority,
preemptible jobs there (Kueue's `withinClusterQueue: LowerPriority`, KAI's in-queue preemption), so a
non-preemptible job within the team's nominal never waits behind the team's borrowed preemptible work.
"""

from dataclasses import dataclass, replace

from chamber.common.quota import admit, may_reclaim
from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.state import SchedulingState


@dataclass(frozen=True, slots=True)
class Option:
    shape: Shape
    """The job's shape, pinned to one pool when quotas are on."""
    borrowing: bool
    reclaim: bool
    """Within its nominal: it may take back capacity other teams borrow."""


@dataclass(frozen=True, slots=True)
class QuotaNeed:
    """A job's team must free `gpus` of its own quota in `pool` (by preempting its own lower-priority work)."""

    team: str
    pool: str
    gpus: int


@dataclass(frozen=True, slots=True)
class Admissions:
    options: list[Option]
    """Where the job may go now, pools within nominal first."""
    refusal: str
    """Why nowhere, when `options` is empty."""
    displace: list[tuple[Option, QuotaNeed]]
    """Pools where the job fits the team's nominal if the team's own lower-priority work makes room."""


def budget_refusal(state: SchedulingState, job: PendingJob) -> str:
    mode = state.budget_blocks.get(job.team)
    if mode == "block-all" or (mode == "block-preemptible" and job.preemptible):
        return f"team {job.team} has used its budget for this period ({mode})"
    return ""


def admissions(state: SchedulingState, job: PendingJob) -> Admissions:
    if not state.quota_on:
        return Admissions([Option(job.shape, False, False)], "", [])
    book = state.quota
    assert book is not None
    pools = [job.shape.pool] if job.shape.pool else state.index.pools(job.shape.gpu_model)
    options: list[Option] = []
    displace: list[tuple[Option, QuotaNeed]] = []
    refusals: list[str] = []
    gpus = job.shape.gpus
    for pool in pools:
        adm = admit(book, state.usage, job.team, pool, gpus, preemptible=job.preemptible)
        pinned = replace(job.shape, pool=pool)
        if adm.ok:
            options.append(Option(pinned, adm.borrowing, may_reclaim(book, state.usage, job.team, pool, gpus)))
            continue
        need = _displacement(state, job, pool)
        if need is None:
            refusals.append(adm.reason)
        elif need == 0:
            options.append(Option(pinned, False, False))
        else:
            displace.append((Option(pinned, False, False), QuotaNeed(job.team, pool, need)))
            refusals.append(adm.reason)
    options.sort(key=lambda o: o.borrowing)
    return Admissions(options, "; ".join(refusals[:2]), displace)


def _displacement(state: SchedulingState, job: PendingJob, pool: str) -> int | None:
    """How many GPUs of the team's own lower-priority, preemptible work must stop for the job to be admitted in
    `pool`: 0 when that work can simply be counted as borrowing instead (the cohort lends enough), None when even
    displacing all of it would not admit the job."""
    book = state.quota
    assert book is not None
    q = book.quota(job.team, pool)
    used = state.usage.get((job.team, pool))
    over = used + job.shape.gpus - q.nominal
    lower = state.preemptible_below(job.team, pool, job.priority)
    if over <= 0 or lower <= 0 or (not job.preemptible and over > lower):
        return None
    limit = q.borrowing_limit if q.borrowing_limit is not None else over
    legal = min(limit, max(0, used - q.nominal) + state.usage.borrowable(job.team, pool))
    need = max(0, over - legal)
    return need if need <= lower else None
