"""Where a gang fits: best-fit packing that honours topology, so whole nodes and racks stay free for large gangs.

Each replica goes on the node with the fewest free GPUs that can hold it (best fit). With a topology
requirement, the gang goes into the single node, rack or zone that fits it most tightly. A preferred topology
falls back to anywhere. `bonus` adds GPUs that are free for this job only (its nomination, a reservation it may
backfill into, or the GPUs of jobs a what-if has evicted).
"""

import heapq
from collections.abc import Mapping, Sequence

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import Shape

Bonus = Mapping[str, Sequence[int]]


def find_placement(index: FleetIndex, shape: Shape, bonus: Bonus | None = None) -> tuple[GpuRef, ...] | None:
    if shape.level is not None:
        placed = _in_one_domain(index, shape, bonus)
        if placed is not None or shape.required:
            return placed
        shape = Shape(shape.per_replica, shape.replicas, shape.pool, shape.gpu_model)
    parts = index.partitions_for(shape)
    if not bonus and shape.replicas == 1:
        name = index.best_fit(parts, shape.per_replica)
        if name is None:
            return None
        return tuple(GpuRef(name, i) for i in index.nodes[name].free[: shape.per_replica])
    if not bonus and index.free_in(parts) < shape.gpus:
        return None
    return _greedy(_candidates(index, shape, bonus), shape)


def _candidates(index: FleetIndex, shape: Shape, bonus: Bonus | None) -> dict[str, list[int]]:
    parts = index.partitions_for(shape)
    cands = {n.name: n.free for n in index.nodes_with(parts, shape.per_replica)}
    if bonus:
        allowed = set(parts)
        for name, extra in bonus.items():
            node = index.nodes.get(name)
            if node is None or node.partition not in allowed:
                continue
            merged = sorted(set(node.free).union(extra))
            if len(merged) >= shape.per_replica:
                cands[name] = merged
    return cands


def _greedy(cands: Mapping[str, Sequence[int]], shape: Shape) -> tuple[GpuRef, ...] | None:
    """Best fit replica by replica: always the node with the fewest free GPUs that still holds a replica."""
    g = shape.per_replica
    heap = [(len(free), name) for name, free in cands.items() if len(free) >= g]
    heapq.heapify(heap)
    used: dict[str, int] = {}
    picked: list[GpuRef] = []
    for _ in range(shape.replicas):
        if not heap:
            return None
        count, name = heapq.heappop(heap)
        start = used.get(name, 0)
        picked.extend(GpuRef(name, i) for i in cands[name][start : start + g])
        used[name] = start + g
        if count - g >= g:
            heapq.heappush(heap, (count - g, name))
    return tuple(picked)


def _in_one_domain(index: FleetIndex, shape: Shape, bonus: Bonus | None) -> tuple[GpuRef, ...] | None:
    assert shape.level is not None
    flat = Shape(shape.per_replica, shape.replicas, shape.pool, shape.gpu_model)
    cands = _candidates(index, flat, bonus)
    if shape.level == "node":
        need = shape.gpus
        fitting = [(len(free), name) for name, free in cands.items() if len(free) >= need]
        if not fitting:
            return None
        _, name = min(fitting)
        return tuple(GpuRef(name, i) for i in cands[name][:need])
    domains: dict[str, dict[str, Sequence[int]]] = {}
    for name, free in cands.items():
        domains.setdefault(index.nodes[name].domain(shape.level), {})[name] = free
    best: tuple[int, str] | None = None
    for domain, members in domains.items():
        slots = sum(len(free) // shape.per_replica for free in members.values())
        if slots >= shape.replicas:
            total = sum(len(free) for free in members.values())
            if best is None or (total, domain) < best:
                best = (total, domain)
    if best is None:
        return None
    return _greedy(domains[best[1]], flat)
