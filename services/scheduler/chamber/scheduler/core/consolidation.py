"""Consolidation: open room for a multi-GPU job on a fragmented fleet by moving a few small jobs elsewhere.

On a busy fleet the free GPUs are scattered: in the contended Philly replays, while 2-8 GPU jobs waited, the
pool often had enough GPUs free in all, but no node had enough of them (best-fit placement cannot prevent it:
one-GPU jobs end at random times on random nodes). KAI-Scheduler's answer is consolidation, and so is this one:
when a job that is next in order fits nowhere although the pool's free GPUs suffice, pick the nodes cheapest to
clear (fewest GPUs of work lost since the movers' last checkpoints), stop the small preemptible jobs there with
their checkpoint grace, and start each of them again at once on GPUs that are free elsewhere now. The plan is
made only if every mover has such a place (best fit, off the nodes being cleared), so a move never turns a
running job into a waiting one; the lost work is what stopping it at its checkpoint loses, charged like any
preemption's.

Only jobs on a single node with fewer GPUs per node than the waiting job needs there are moved (a move never
makes room for a job by moving one as large), at most `max_moved_gpus` GPUs per plan. Pure: the fleet index is
changed only while a plan is tried, and left as it was.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import RunningJob, Shape
from chamber.scheduler.core.placement import find_placement

NODES_TRIED = 8
"""Cheapest target sets tried per plan (each try places the movers once): bounds a plan's cost on large fleets."""


@dataclass(frozen=True, slots=True)
class Move:
    job: RunningJob
    to: tuple[GpuRef, ...]
    """Where it starts again once stopped (free now; held for it until then)."""


@dataclass(frozen=True, slots=True)
class ConsolidationPlan:
    moves: tuple[Move, ...]
    gpus: tuple[GpuRef, ...]
    """Where the waiting job runs once the movers have stopped."""
    lost_gpu_s: float
    """Work the movers lose (since their last checkpoints), in GPU-seconds."""


def move_cost(job: RunningJob, now: float) -> float:
    """GPU-seconds a move costs: the work since its last checkpoint, and its checkpoint grace."""
    return (job.work_lost_if_stopped(now) + job.checkpoint_grace_s) * len(job.gpus)


def single_node_jobs(running: Iterable[RunningJob]) -> dict[str, list[RunningJob]]:
    """node -> the running jobs held on that node alone (the only ones a move can re-place whole)."""
    by_node: dict[str, list[RunningJob]] = {}
    for r in running:
        if len(r.spread) == 1:
            by_node.setdefault(r.spread[0][0], []).append(r)
    return by_node


def plan_consolidation(
    index: FleetIndex,
    shape: Shape,
    on_node: Mapping[str, Sequence[RunningJob]],
    now: float,
    *,
    movable: Callable[[RunningJob], bool],
    max_moved_gpus: int,
) -> ConsolidationPlan | None:
    """The cheapest plan found that frees `shape.replicas` nodes with `shape.per_replica` GPUs each by moving
    movable single-node jobs, each re-placed at once elsewhere; None when the pool's free GPUs do not suffice,
    the shape has a topology requirement, or no plan re-places every mover."""
    if shape.level is not None:
        return None
    parts = index.partitions_for(shape)
    if index.free_in(parts) < shape.gpus:
        return None
    need = shape.per_replica
    ready = sorted((n.name for n in index.nodes_with(parts, need)), key=lambda n: (len(index.nodes[n].free), n))
    if len(ready) >= shape.replicas:
        return None  # it fits without moving anything: nothing to plan (the next cycle places it, in queue order)
    options: list[tuple[float, int, str, tuple[RunningJob, ...]]] = []
    for name in index.nodes_in(parts):
        node = index.nodes[name]
        deficit = need - len(node.free)
        if deficit <= 0 or node.capacity < need:
            continue
        movers = _cheapest_movers(on_node.get(name, ()), deficit, need, now, movable)
        if movers is None:
            continue
        moved = sum(len(m.gpus) for m in movers)
        options.append((sum(move_cost(m, now) for m in movers), moved, name, movers))
    options.sort(key=lambda o: (o[0], o[1], o[2]))
    missing = shape.replicas - len(ready)
    for start in range(min(NODES_TRIED, len(options) - missing + 1)):
        chosen = options[start : start + missing]
        if sum(o[1] for o in chosen) > max_moved_gpus:
            continue
        targets = [*ready[: shape.replicas - missing], *(o[2] for o in chosen)]
        moves = _place_movers(index, [m for o in chosen for m in o[3]], targets)
        if moves is None:
            continue
        gpus = _gpus_on(index, targets, moves, need)
        return ConsolidationPlan(moves, gpus, sum(o[0] for o in chosen))
    return None


def _cheapest_movers(
    jobs: Sequence[RunningJob], deficit: int, need: int, now: float, movable: Callable[[RunningJob], bool]
) -> tuple[RunningJob, ...] | None:
    """The cheapest jobs on one node that free `deficit` GPUs there: cheapest first until enough, then every one
    the total does not need dropped (most expensive first)."""
    cands = sorted(
        (j for j in jobs if len(j.gpus) < need and movable(j)), key=lambda j: (move_cost(j, now), len(j.gpus), j.id)
    )
    chosen: list[RunningJob] = []
    freed = 0
    for j in cands:
        chosen.append(j)
        freed += len(j.gpus)
        if freed >= deficit:
            break
    else:
        return None
    for j in reversed(chosen[:-1]):
        if freed - len(j.gpus) >= deficit:
            chosen.remove(j)
            freed -= len(j.gpus)
    return tuple(chosen)


def _place_movers(index: FleetIndex, movers: list[RunningJob], cleared: list[str]) -> tuple[Move, ...] | None:
    """Each mover on free GPUs off the `cleared` nodes (largest first, best fit), or None when one has no place.
    The index is restored before returning. The nodes are hidden and given back in the order given: the index
    breaks ties among equally free nodes by the order their GPUs came back, so an order that depended on string
    hashing (a set) made replays differ from run to run."""
    hidden = {name: list(index.nodes[name].free) for name in dict.fromkeys(cleared)}
    for name, free in hidden.items():
        index.take(name, free)
    taken: list[tuple[str, list[int]]] = []
    moves: list[Move] = []
    try:
        for mover in sorted(movers, key=lambda m: (-len(m.gpus), m.id)):
            node = index.nodes.get(mover.gpus[0].node)
            if node is None:
                return None
            gpus = find_placement(index, Shape(len(mover.gpus), 1, node.pool, node.model))
            if gpus is None:
                return None
            indices = [g.index for g in gpus]
            index.take(gpus[0].node, indices)
            taken.append((gpus[0].node, indices))
            moves.append(Move(mover, gpus))
        return tuple(moves)
    finally:
        for name, indices in taken:
            index.give(name, indices)
        for name, free in hidden.items():
            index.give(name, free)


def _gpus_on(index: FleetIndex, nodes: list[str], moves: tuple[Move, ...], need: int) -> tuple[GpuRef, ...]:
    """`need` GPUs on each of `nodes`: the free ones first, then those the movers leave."""
    left: dict[str, list[int]] = {}
    for move in moves:
        for ref in move.job.gpus:
            left.setdefault(ref.node, []).append(ref.index)
    picked: list[GpuRef] = []
    for name in nodes:
        slots = [*index.nodes[name].free, *sorted(left.get(name, ()))]
        picked.extend(GpuRef(name, i) for i in slots[:need])
    return tuple(picked)
