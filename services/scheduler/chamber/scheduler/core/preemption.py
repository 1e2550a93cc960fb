"""Choosing whom to preempt: the cheapest set of victims that really makes room for a waiting gang.

Victims must be preemptible, of strictly lower priority, past their minimum runtime and not already stopping.
Strictly lower priority is what rules out preemption cycles: two jobs can never preempt each other.
Cost order (cheapest first): capacity borrowed beyond quota, then lowest priority, then least work lost since the
last checkpoint, then fewest GPUs. The search adds victims in that order until the gang fits (counted in O(1)
per step), drops every victim the fit does not need (most expensive first), then places the gang in a what-if
and keeps only the victims whose GPUs the placement uses. A plan is returned only if that placement exists.
"""

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.capacity import CapacityCounter
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import PendingJob, RunningJob
from chamber.scheduler.core.whatif import WhatIf, per_node


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    victims: tuple[RunningJob, ...]
    gpus: tuple[GpuRef, ...]
    """Where the preemptor will run once the victims have stopped."""


def can_be_victim(victim: RunningJob, preemptor_priority: int, now: float) -> bool:
    return (
        victim.preemptible
        and not victim.stopping
        and victim.priority < preemptor_priority
        and now - victim.started_at >= victim.min_runtime_s
    )


def can_be_reclaimed(victim: RunningJob, now: float) -> bool:
    """Another team's job may be taken back to reclaim borrowed capacity whatever its priority (only preemptible
    jobs ever borrow); how many GPUs a team may lose is bounded by what it borrows (`budgets`)."""
    return victim.preemptible and not victim.stopping and now - victim.started_at >= victim.min_runtime_s


VictimCost = tuple[bool, int, float, int, str, str]


def victim_cost(victim: RunningJob, now: float) -> VictimCost:
    """Cheapest first: borrowed capacity, lowest priority, least work lost, fewest GPUs; then, among victims that
    cost the same, by node, so equally cheap victims on one node come together and free whole nodes (with
    thousands of identical one-GPU victims, ordering them by id alone scatters a gang's victims over the fleet)."""
    gpus = victim.gpus
    return (not victim.borrowed, victim.priority, victim.work_lost_if_stopped(now), len(gpus), gpus[0].node, victim.id)


def plan_preemption(
    index: FleetIndex,
    job: PendingJob,
    running: Iterable[RunningJob],
    now: float,
    allowed: Callable[[RunningJob], bool] | None = None,
    *,
    budgets: Mapping[str, int] | None = None,
    quota_need: tuple[str, str, int] | None = None,
    by_cost: bool = False,
    strict_budgets: bool = False,
    reclaim_need: int = 0,
) -> PreemptionPlan | None:
    """`allowed` replaces the default victim rule (quota: own team by priority, other teams only by reclaim).
    `budgets` is what each listed team borrows above its nominal: a team's jobs may be taken while it still
    borrows before each of them (Kueue's rule), so the last one taken may leave it a little below its nominal
    when its jobs are larger than what it borrows; otherwise fragmentation could hide borrowed capacity for good.
    `strict_budgets`: a team's jobs are taken only while all of them together stay within its budget (a reclaim
    past the preemptor's guarantee must leave every victim's team borrowing at least as much as it will).
    `quota_need` (team, pool, gpus): the victims must also free that many GPUs of that team's quota in that pool
    (the job displaces its own team's lower-priority work). `reclaim_need`: the victims of the teams in `budgets`
    must free that many GPUs (a job the quota refuses, which starts only by reclaiming borrowed capacity: free
    GPUs alone would take it past what its cohort may lend). `by_cost`: `running` is already in cost order."""
    parts = index.partitions_for(job.shape)
    eligible = index.nodes_in(parts)
    everywhere = len(parts) == index.partition_count()
    rule = allowed or (lambda r: can_be_victim(r, job.priority, now))

    def candidate(r: RunningJob) -> bool:
        return rule(r) and (everywhere or any(g.node in eligible for g in r.gpus))

    # `filter`, not a generator expression: the search stops at the first victims that make room, and compiled
    # (see `chamber.scheduler.core`), a generator expression is built whole first.
    candidates: Iterable[RunningJob] = filter(candidate, running)
    if not by_cost:
        candidates = sorted(candidates, key=lambda r: victim_cost(r, now))
    avail = {node.name: len(node.free) for node in index.nodes_with(parts, 1)}
    for name, n in per_node(job.nominated, eligible).items():
        avail[name] = avail.get(name, 0) + n
    orders = [candidates]
    only = None if everywhere else eligible
    if budgets:
        # With per-team caps, the cheapest-first greedy can spend a team's budget on victims scattered over many
        # nodes and then have to skip the one whose node would free the gang. Try a node-by-node order too.
        listed = list(candidates)
        orders = [listed, _node_order(listed, avail, only, budgets, strict_budgets)]
    for order in orders:
        plan = _search(
            index,
            job,
            order,
            dict(avail),
            only=only,
            budgets=budgets,
            quota_need=quota_need,
            strict=strict_budgets,
            reclaim_need=reclaim_need,
        )
        if plan is not None:
            return plan
    return None


def _freed(victim: RunningJob, only: Set[str] | None) -> tuple[tuple[str, int], ...]:
    """Where stopping `victim` frees GPUs (only on `only`'s nodes, when given)."""
    if only is None:
        return victim.spread
    return tuple((name, n) for name, n in victim.spread if name in only)


def _node_order(
    candidates: list[RunningJob],
    avail: Mapping[str, int],
    only: Set[str] | None,
    budgets: Mapping[str, int] | None = None,
    strict: bool = False,
) -> list[RunningJob]:
    """Victims grouped by node, the nodes that would be freest first (cheapest victims first within a node). A
    node's room counts a team's victims there only as far as the team's budget lets them be taken (`_search`'s
    rule, victims of the node alone): a node full of one team's small jobs, of which its budget allows one, came
    first by name and spent the budget, where another node's one larger job of that team would have freed the
    gang (found by test_quota_invariants_over_time: a team within its guarantee waited 34 s for nothing)."""
    room: dict[str, int] = dict(avail)
    spent: dict[tuple[str, str], int] = {}
    for v in candidates:
        limit = budgets.get(v.team) if budgets is not None else None
        for name, n in _freed(v, only):
            if limit is not None:
                taken = spent.get((name, v.team), 0)
                if taken + len(v.gpus) > limit if strict else taken >= limit:
                    continue
                spent[(name, v.team)] = taken + len(v.gpus)
            room[name] = room.get(name, 0) + n
    return sorted(candidates, key=lambda v: (-max(room.get(g.node, 0) for g in v.gpus), v.gpus[0].node))


def _search(
    index: FleetIndex,
    job: PendingJob,
    candidates: Iterable[RunningJob],
    avail: dict[str, int],
    *,
    only: Set[str] | None,
    budgets: Mapping[str, int] | None,
    quota_need: tuple[str, str, int] | None,
    strict: bool = False,
    reclaim_need: int = 0,
) -> PreemptionPlan | None:
    counter = CapacityCounter(index, job.shape, avail)
    team, pool, need = quota_need if quota_need is not None else ("", "", reclaim_need)
    needs_quota = quota_need is not None or reclaim_need > 0

    def quota_of(victim: RunningJob) -> int:
        if quota_need is not None:
            return len(victim.gpus) if victim.team == team and victim.pool == pool else 0
        return len(victim.gpus) if reclaim_need and budgets is not None and victim.team in budgets else 0

    chosen: list[RunningJob] = []
    spent: dict[str, int] = {}
    freed_quota = 0
    for victim in candidates:
        if budgets is not None and victim.team in budgets:
            taken, limit = spent.get(victim.team, 0), budgets[victim.team]
            if taken + len(victim.gpus) > limit if strict else taken >= limit:
                continue  # it would no longer borrow (strict: enough) once the victims taken so far are gone
            spent[victim.team] = spent.get(victim.team, 0) + len(victim.gpus)
        for name, n in _freed(victim, only):
            counter.add(name, n)
        chosen.append(victim)
        freed_quota += quota_of(victim)
        if freed_quota >= need and counter.fits():
            break
    else:
        return None
    # Drop every victim the fit (and the quota) does not need, most expensive first. Marked, not removed one by
    # one from the list: with hundreds of cheap, tied victims that was quadratic.
    dropped: set[str] = set()
    for victim in reversed(chosen[:-1]):
        freed = _freed(victim, only)
        for name, n in freed:
            counter.remove(name, n)
        share = quota_of(victim)
        if freed_quota - share >= need and counter.fits():
            dropped.add(victim.id)
            freed_quota -= share
        else:
            for name, n in freed:
                counter.add(name, n)
    kept = [v for v in chosen if v.id not in dropped]
    trial = WhatIf(index, job.nominated)
    for victim in kept:
        trial.evict(victim.gpus)
    gpus = trial.allocate(job.shape)
    if gpus is None:
        return None
    used = {g.slot for g in gpus}
    needed = [v for v in kept if any(g.slot in used for g in v.gpus)]
    if needs_quota:
        # The placement may not need every victim's GPUs, but the quota needs room: keep the cheapest of the rest
        # until it has it.
        short = need - sum(quota_of(v) for v in needed)
        for victim in kept:
            if short <= 0:
                break
            if victim not in needed and quota_of(victim):
                needed.append(victim)
                short -= quota_of(victim)
    return PreemptionPlan(tuple(needed), gpus)
