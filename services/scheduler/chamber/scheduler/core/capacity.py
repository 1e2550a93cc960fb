"""Does a shape fit yet? Answered in O(1) as GPUs are added or removed, for what-if searches.

Preemption planning and backfill reservations both grow a set of available GPUs one job at a time and ask
after each step whether the waiting gang would fit. Re-running placement at every step would cost O(nodes);
this counter keeps, per node and per topology domain, how many replicas fit, and updates only what changed.
"""

from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import Shape


class CapacityCounter:
    def __init__(self, index: FleetIndex, shape: Shape, avail: dict[str, int]) -> None:
        self.shape = shape
        self.level = shape.level if shape.required else None
        self.index = index
        self.avail = avail
        self.g = shape.per_replica
        self.need = shape.gpus if self.level == "node" else shape.replicas
        self.total = 0
        """Replica slots in total (no topology), or nodes holding the gang (node level)."""
        self.domain_slots: dict[str, int] = {}
        self.domains_ok = 0
        for name, count in avail.items():
            self._apply(name, 0, count)

    def _slots(self, count: int) -> int:
        if self.level == "node":
            return 1 if count >= self.need else 0
        return count // self.g

    def _apply(self, name: str, before: int, after: int) -> None:
        delta = self._slots(after) - self._slots(before)
        if not delta:
            return
        if self.level in ("rack", "zone"):
            domain = self.index.nodes[name].domain(self.level)
            old = self.domain_slots.get(domain, 0)
            new = old + delta
            self.domain_slots[domain] = new
            self.domains_ok += (new >= self.need) - (old >= self.need)
        else:
            self.total += delta

    def add(self, name: str, n: int) -> None:
        before = self.avail.get(name, 0)
        self.avail[name] = before + n
        self._apply(name, before, before + n)

    def remove(self, name: str, n: int) -> None:
        before = self.avail[name]
        self.avail[name] = before - n
        self._apply(name, before, before - n)

    def fits(self) -> bool:
        if self.level in ("rack", "zone"):
            return self.domains_ok > 0
        if self.level == "node":
            return self.total > 0
        return self.total >= self.need
