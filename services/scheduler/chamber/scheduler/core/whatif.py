"""A reversible what-if over the fleet: evict jobs, try to place a gang, and keep the result only if it fits.

Nothing here touches the real fleet index: evicted GPUs become a `bonus` for the one trial placement, so a
plan that does not fit simply goes away (the rollback), and one that fits is returned to be committed.
"""

from collections import Counter
from collections.abc import Iterable, Set

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import Shape
from chamber.scheduler.core.placement import find_placement


class WhatIf:
    def __init__(self, index: FleetIndex, bonus: Iterable[GpuRef] = ()) -> None:
        self.index = index
        self._freed: dict[str, list[int]] = {}
        for ref in bonus:
            self._freed.setdefault(ref.node, []).append(ref.index)

    def evict(self, gpus: Iterable[GpuRef]) -> None:
        for ref in gpus:
            self._freed.setdefault(ref.node, []).append(ref.index)

    def allocate(self, shape: Shape) -> tuple[GpuRef, ...] | None:
        return find_placement(self.index, shape, bonus=self._freed)


def per_node(gpus: Iterable[GpuRef], nodes: Set[str] | None = None) -> Counter[str]:
    """How many of `gpus` sit on each node (only on `nodes`, when given)."""
    return Counter(g.node for g in gpus if nodes is None or g.node in nodes)
