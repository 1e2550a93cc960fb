"""May this job start now, and where, as far as team quotas and budgets are concerned?

With quotas on, a job may go only to pools its team's quota admits it to (within nominal first, then borrowing);
a refusal says why. A team's own higher-priority work always comes before its own lower-priority work: when the
team's quota in a pool is full, a job may still be admitted by displacing the team's own lower-priority,
preemptible jobs there (Kueue's `withinClusterQueue: LowerPriority`, KAI's in-queue preemption), so a
non-preemptible job within the team's nominal never waits behind the team's borrowed preemptible work.

A team below its guarantee whose job is wider than its unused guarantee (a team at 14 of 16 guaranteed GPUs
waiting with a 4-GPU job) can take it no further by the nominal rule alone: no job of it fits the guarantee, and
the idle GPUs it lends are borrowed by others. `reclaim_past` says how far past its guarantee such a job would
take the team: the cycle may then reclaim for it too (see `cycle`), the way Kueue's fair-sharing preemption
reasons (a preemptor may take from a borrower as long as it ends no further above its guarantee than the
borrower does).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from chamber.common.quota import QuotaBook, QuotaUsage, admits, may_reclaim
from chamber.scheduler.core.model import PendingJob, RunningJob, Shape
from chamber.scheduler.core.state import SchedulingState

if TYPE_CHECKING:
    from chamber.scheduler.core.cycle import CycleContext


@dataclass(frozen=True, slots=True)
class Option:
    shape: Shape
    """The job's shape, pinned to one pool when quotas are on."""
    borrowing: bool
    reclaim: bool
    """Within its nominal: it may take back capacity other teams borrow."""
    past: int = 0
    """GPUs the job would take its team past its guarantee though the team is below it now (`reclaim_past`):
    it may reclaim from teams that borrow more than that, when it is the team's smallest waiting job."""

    def __init__(self, shape: Shape, borrowing: bool, reclaim: bool, past: int = 0) -> None:
        object.__setattr__(self, "shape", shape)  # (its own `__init__`: see `decisions`)
        object.__setattr__(self, "borrowing", borrowing)
        object.__setattr__(self, "reclaim", reclaim)
        object.__setattr__(self, "past", past)


@dataclass(frozen=True, slots=True)
class QuotaNeed:
    """A job's team must free `gpus` of its own quota in `pool` (by preempting its own lower-priority work)."""

    team: str
    pool: str
    gpus: int

    def __init__(self, team: str, pool: str, gpus: int) -> None:
        object.__setattr__(self, "team", team)
        object.__setattr__(self, "pool", pool)
        object.__setattr__(self, "gpus", gpus)


@dataclass(frozen=True, slots=True)
class Admissions:
    options: list[Option]
    """Where the job may go now, pools within nominal first."""
    refusal: str
    """Why nowhere, when `options` is empty."""
    displace: list[tuple[Option, QuotaNeed]]
    """Pools where the job fits the team's nominal if the team's own lower-priority work makes room."""
    pools: list[str]
    """The pools the job may use at all (its own, or every pool of its GPU model)."""
    reclaim_only: list[Option] = field(default_factory=list)
    """Pools the quota refuses (the cohort has nothing to lend) where the job could still start by reclaiming
    past its team's guarantee (`Option.past`); never placed on free GPUs directly."""

    def __init__(
        self,
        options: list[Option],
        refusal: str,
        displace: list[tuple[Option, QuotaNeed]],
        pools: list[str],
        reclaim_only: list[Option] | None = None,
    ) -> None:
        object.__setattr__(self, "options", options)  # (its own `__init__`: see `decisions`)
        object.__setattr__(self, "refusal", refusal)
        object.__setattr__(self, "displace", displace)
        object.__setattr__(self, "pools", pools)
        object.__setattr__(self, "reclaim_only", [] if reclaim_only is None else reclaim_only)


def budget_refusal(state: SchedulingState, job: PendingJob) -> str:
    mode = state.budget_blocks.get(job.team)
    if mode == "block-all" or (mode == "block-preemptible" and job.preemptible):
        return f"team {job.team} has used its budget for this period ({mode})"
    return ""


def admissions(
    state: SchedulingState, job: PendingJob, ctx: "CycleContext | None" = None, *, explain: bool = True
) -> Admissions:
    """Where `job` may go now (see `Admissions`). Without `explain` the refusal is left empty: wording it is most
    of the cost of a refused job's look, and only a waiting reason needs it."""
    if not state.quota_on:
        return Admissions([Option(job.shape, False, False)], "", [], [])
    book = state.quota
    assert book is not None
    if ctx is not None:
        pools = ctx.pools_of(state, job.shape)
    else:
        pools = [job.shape.pool] if job.shape.pool else state.index.pools(job.shape.gpu_model)
    options: list[Option] = []
    displace: list[tuple[Option, QuotaNeed]] = []
    reclaim_only: list[Option] = []
    refusals: list[str] = []
    gpus = job.shape.gpus
    for pool in pools:
        ok, borrowing = admits(book, state.usage, job.team, pool, gpus, preemptible=job.preemptible)
        pinned = ctx.pinned(job.shape, pool) if ctx is not None else replace(job.shape, pool=pool)
        past = reclaim_past(book, state.usage, job.team, pool, gpus, preemptible=job.preemptible)
        if ok:
            reclaim = may_reclaim(book, state.usage, job.team, pool, gpus)
            options.append(Option(pinned, borrowing, reclaim, past if borrowing else 0))
            continue
        need = displacement(state, job.team, pool, gpus=gpus, priority=job.priority, preemptible=job.preemptible)
        if need == 0:
            options.append(Option(pinned, False, False))
            continue
        if need is not None:
            displace.append((Option(pinned, False, False), QuotaNeed(job.team, pool, need)))
        if past:
            reclaim_only.append(Option(pinned, True, False, past))
        if explain:
            refusals.append(_why(state, job, pool))
    options.sort(key=lambda o: o.borrowing)
    return Admissions(options, "; ".join(refusals[:2]), displace, pools, reclaim_only)


def _why(state: SchedulingState, job: PendingJob, pool: str) -> str:
    """Why the team's quota does not admit the job in `pool`, in words that stay the same while nothing about it
    changes (the numbers change every cycle; a reason is stored only when its words change)."""
    book = state.quota
    assert book is not None
    q = book.quota(job.team, pool)
    if state.usage.used_in(job.team, pool) + job.shape.gpus <= q.nominal:
        return f"team {job.team} may not borrow more in {pool}"
    if not job.preemptible:
        return f"team {job.team} is at its nominal quota in {pool} (only preemptible jobs borrow)"
    if (
        q.borrowing_limit is not None
        and state.usage.used_in(job.team, pool) + job.shape.gpus > q.nominal + q.borrowing_limit
    ):
        return f"team {job.team} is at its borrowing limit in {pool}"
    return f"team {job.team}'s cohort has no idle GPUs to lend in {pool}"


def displacement(
    state: SchedulingState, team: str, pool: str, *, gpus: int, priority: int, preemptible: bool
) -> int | None:
    """How many GPUs of the team's own lower-priority, preemptible work must stop for a job of `gpus` at
    `priority` to be admitted in `pool`: 0 when that work can simply be counted as borrowing instead (the cohort
    lends enough), None when even displacing all of it would not admit the job. Harder for more GPUs and for
    lower priority, so a check with the smallest and highest-priority of several jobs bounds them all."""
    book = state.quota
    assert book is not None
    q = book.quota(team, pool)
    used = state.usage.used_in(team, pool)
    over = used + gpus - q.nominal
    lower = state.preemptible_below(team, pool, priority)
    if over <= 0 or lower <= 0 or (not preemptible and over > lower):
        return None
    limit = q.borrowing_limit if q.borrowing_limit is not None else over
    legal = min(limit, max(0, used - q.nominal) + state.usage.borrowable(team, pool))
    need = max(0, over - legal)
    return need if need <= lower else None


def admitted_after(state: SchedulingState, job: PendingJob, pool: str, victims: Iterable[RunningJob]) -> bool:
    """Whether the quota admits `job` in `pool` once `victims` have stopped (their GPUs back in their teams'
    quota): a job the quota refuses now starts by reclaiming only when its victims make that room."""
    book = state.quota
    if book is None:
        return True
    usage = state.usage
    taken = [(v.team, v.pool, len(v.gpus)) for v in victims]
    for team, where, n in taken:
        usage.add(team, where, -n)
    try:
        return admits(book, usage, job.team, pool, job.shape.gpus, preemptible=job.preemptible)[0]
    finally:
        for team, where, n in taken:
            usage.add(team, where, n)


def reclaim_past(book: QuotaBook, usage: QuotaUsage, team: str, pool: str, gpus: int, *, preemptible: bool) -> int:
    """How many GPUs past its guarantee a job of `gpus` takes its team in `pool`, when the team is below its
    guarantee now and the job is wider than what is left of it; 0 otherwise (within the guarantee, or the team
    already at or above it). Only preemptible jobs go past a guarantee (they borrow), and never past the
    borrowing limit."""
    if not book.enabled or not preemptible:
        return 0
    q = book.quota(team, pool)
    used = usage.get((team, pool), 0)
    past = used + gpus - q.nominal
    if used >= q.nominal or past <= 0:
        return 0
    if q.borrowing_limit is not None and past > q.borrowing_limit:
        return 0
    return past
