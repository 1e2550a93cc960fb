"""Choosing whom to preempt: the cheapest set of victims that really makes room for a waiting gang.

Victims must be preemptible, of strictly lower priority, past their minimum runtime and not already stopping.
Strictly lower priority is what rules out preemption cycles: two jobs can never preempt each other.
Cost order (cheapest first): capacity borrowed beyond quota, then lowest priority, then least work lost since the
last checkpoint, then fewest GPUs. The search adds victims in that order until the gang fits (counted in O(1)
per step), drops every victim the fit does not need (most expensive first), then places the gang in a what-if
and keeps only the victims whose GPUs the placement uses. A plan is returned only if that placement exists.
"""

from collections.abc import Callable, Iterable, Mapping
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


def victim_cost(victim: RunningJob, now: float) -> tuple[bool, int, float, int, str]:
    return (not victim.borrowed, victim.priority, victim.work_lost_if_stopped(now), len(victim.gpus), victim.id)


def plan_preemption(
    index: FleetIndex,
    job: PendingJob,
    running: Iterable[RunningJob],
    now: float,
    allowed: Callable[[RunningJob], bool] | None = None,
    *,
    budgets: Mapping[str, int] | None = None,
) -> PreemptionPlan | None:
    """`allowed` replaces the default victim rule (quota: own team by priority, other teams only by reclaim).
    `budgets` caps the GPUs taken from each listed team (what it borrows above its nominal): any of a borrowing
    team's jobs may go, so fragmentation cannot hide the borrowed capacity, but never more than it borrows."""
    parts = set(index.partitions_for(job.shape))
    eligible = {name for name, node in index.nodes.items() if node.partition in parts}
    rule = allowed or (lambda r: can_be_victim(r, job.priority, now))
    candidates = [r for r in running if rule(r) and any(g.node in eligible for g in r.gpus)]
    if not candidates:
        return None
    candidates.sort(key=lambda r: victim_cost(r, now))
    avail = {node.name: len(node.free) for node in index.nodes_with(index.partitions_for(job.shape), 1)}
    for name, n in per_node(job.nominated, eligible).items():
        avail[name] = avail.get(name, 0) + n
    orders = [candidates]
    if budgets:
        # With per-team caps, the cheapest-first greedy can spend a team's budget on victims scattered over many
        # nodes and then have to skip the one whose node would free the gang. Try a node-by-node order too.
        orders.append(_node_order(candidates, avail, eligible))
    for order in orders:
        plan = _search(index, job, order, dict(avail), eligible=eligible, budgets=budgets)
        if plan is not None:
            return plan
    return None


def _node_order(candidates: list[RunningJob], avail: Mapping[str, int], eligible: set[str]) -> list[RunningJob]:
    """Victims grouped by node, the nodes that would be freest first (cheapest victims first within a node)."""
    room: dict[str, int] = dict(avail)
    for v in candidates:
        for name, n in per_node(v.gpus, eligible).items():
            room[name] = room.get(name, 0) + n
    return sorted(candidates, key=lambda v: (-max(room.get(g.node, 0) for g in v.gpus), v.gpus[0].node))


def _search(
    index: FleetIndex,
    job: PendingJob,
    candidates: list[RunningJob],
    avail: dict[str, int],
    *,
    eligible: set[str],
    budgets: Mapping[str, int] | None,
) -> PreemptionPlan | None:
    counter = CapacityCounter(index, job.shape, avail)
    chosen: list[RunningJob] = []
    spent: dict[str, int] = {}
    for victim in candidates:
        if budgets is not None and victim.team in budgets:
            if spent.get(victim.team, 0) + len(victim.gpus) > budgets[victim.team]:
                continue
            spent[victim.team] = spent.get(victim.team, 0) + len(victim.gpus)
        for name, n in per_node(victim.gpus, eligible).items():
            counter.add(name, n)
        chosen.append(victim)
        if counter.fits():
            break
    else:
        return None
    for victim in reversed(chosen[:-1]):
        freed = per_node(victim.gpus, eligible)
        for name, n in freed.items():
            counter.remove(name, n)
        if counter.fits():
            chosen.remove(victim)
        else:
            for name, n in freed.items():
                counter.add(name, n)
    trial = WhatIf(index, job.nominated)
    for victim in chosen:
        trial.evict(victim.gpus)
    gpus = trial.allocate(job.shape)
    if gpus is None:
        return None
    used = {g.slot for g in gpus}
    needed = tuple(v for v in chosen if any(g.slot in used for g in v.gpus))
    return PreemptionPlan(needed, gpus)
