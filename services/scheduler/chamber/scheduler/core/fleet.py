"""The fleet as the scheduler sees it in one cycle: free GPU slots per node, indexed for fast best-fit.

Nodes are grouped into partitions (pool, GPU model); within a partition, nodes sit in buckets by how many GPUs
they have free, so the best-fitting node for a request is found without scanning the fleet. Slots that are
claimed, cordoned, nominated to a preemptor or reserved for a blocked job are simply not free here.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from sys import intern

from chamber.scheduler.core.model import Shape

Partition = tuple[str, str]
"""(pool, gpu_model)."""


@dataclass(slots=True)
class NodeSlots:
    name: str
    pool: str
    model: str
    rack: str
    zone: str
    capacity: int
    free: list[int]
    """Free GPU indices, ascending."""

    @property
    def partition(self) -> Partition:
        return (self.pool, self.model)

    def domain(self, level: str) -> str:
        return self.rack if level == "rack" else self.zone if level == "zone" else self.name


class FleetIndex:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeSlots] = {}
        self._buckets: dict[Partition, list[dict[str, None]]] = {}
        self._free: dict[Partition, int] = {}
        self._free_total = 0
        """Free GPUs in all partitions (asked before each queue head a cycle looks at)."""
        self._parts_cache: dict[tuple[str | None, str | None], tuple[Partition, ...]] = {}
        self._nodes_cache: dict[tuple[Partition, ...], frozenset[str]] = {}
        self._capacity_cache: dict[tuple[tuple[Partition, ...], int], tuple[int, int]] = {}

    def add_node(
        self, name: str, *, pool: str, model: str, rack: str, zone: str, capacity: int, free: Iterable[int]
    ) -> None:
        assert name not in self.nodes, f"node {name} added twice"
        node = NodeSlots(name, intern(pool), intern(model), rack, zone, capacity, sorted(free))  # (see `JobQueue.push`)
        self.nodes[name] = node
        part = node.partition
        self._nodes_cache.clear()
        self._capacity_cache.clear()
        if part not in self._buckets:
            self._parts_cache.clear()
            self._buckets[part] = []
            self._free[part] = 0
        self._bucket(part, len(node.free))[name] = None
        self._free[part] += len(node.free)
        self._free_total += len(node.free)

    def _bucket(self, part: Partition, count: int) -> dict[str, None]:
        buckets = self._buckets[part]
        while len(buckets) <= count:
            buckets.append({})
        return buckets[count]

    def take(self, node_name: str, indices: Iterable[int]) -> None:
        node = self.nodes[node_name]
        before = len(node.free)
        gone = set(indices)
        node.free = [i for i in node.free if i not in gone]
        self._move(node, before)

    def give(self, node_name: str, indices: Iterable[int]) -> None:
        node = self.nodes.get(node_name)
        if node is None:
            return
        before = len(node.free)
        node.free = sorted(set(node.free).union(indices))
        self._move(node, before)

    def _move(self, node: NodeSlots, before: int) -> None:
        after = len(node.free)
        if after == before:
            return
        part = node.partition
        del self._buckets[part][before][node.name]
        self._bucket(part, after)[node.name] = None
        self._free[part] += after - before
        self._free_total += after - before

    def partitions_for(self, shape: Shape) -> tuple[Partition, ...]:
        key = (shape.pool, shape.gpu_model)
        parts = self._parts_cache.get(key)
        if parts is None:
            parts = tuple(
                sorted(
                    p
                    for p in self._buckets
                    if (shape.pool is None or p[0] == shape.pool)
                    and (shape.gpu_model is None or p[1] == shape.gpu_model)
                )
            )
            self._parts_cache[key] = parts
        return parts

    def nodes_in(self, parts: tuple[Partition, ...]) -> frozenset[str]:
        """The names of every node in `parts` (cached: the fleet changes rarely, this is asked per plan)."""
        names = self._nodes_cache.get(parts)
        if names is None:
            wanted = set(parts)
            names = frozenset(n for n, node in self.nodes.items() if node.partition in wanted)
            self._nodes_cache[parts] = names
        return names

    def capacity_for(self, parts: tuple[Partition, ...], per_replica: int) -> tuple[int, int]:
        """(GPUs of the largest node, replicas of `per_replica` GPUs the nodes could hold if all were free)."""
        key = (parts, per_replica)
        found = self._capacity_cache.get(key)
        if found is None:
            caps = [self.nodes[n].capacity for n in self.nodes_in(parts)]
            found = (max(caps, default=0), sum(c // per_replica for c in caps))
            self._capacity_cache[key] = found
        return found

    def pools(self, gpu_model: str | None = None) -> list[str]:
        return sorted({p for p, m in self._buckets if gpu_model is None or m == gpu_model})

    def partition_count(self) -> int:
        return len(self._buckets)

    def free_in(self, parts: Iterable[Partition]) -> int:
        return sum(self._free[p] for p in parts)

    def free_total(self) -> int:
        return self._free_total

    def best_fit(self, parts: tuple[Partition, ...], need: int) -> str | None:
        """The node with the fewest free GPUs that still has `need` (first in its bucket on ties)."""
        best: tuple[int, str] | None = None
        for part in parts:
            buckets = self._buckets[part]
            for count in range(need, len(buckets)):
                bucket = buckets[count]
                if bucket:
                    name = next(iter(bucket))
                    if best is None or (count, name) < best:
                        best = (count, name)
                    break
        return None if best is None else best[1]

    def nodes_with(self, parts: tuple[Partition, ...], at_least: int) -> Iterator[NodeSlots]:
        """Every node in `parts` with at least `at_least` free GPUs."""
        for part in parts:
            buckets = self._buckets[part]
            for count in range(max(at_least, 1), len(buckets)):
                for name in buckets[count]:
                    yield self.nodes[name]

    def fragmented_gpus(self, whole: int = 8) -> int:
        """Free GPUs on nodes that have fewer than `whole` free: free, yet unusable for a `whole`-GPU replica."""
        return sum(len(n.free) for n in self.nodes.values() if 0 < len(n.free) < whole)
