"""FIFO first-fit placement: the walking skeleton's policy.

Jobs are taken in queue order (priority class, then submit time); each replica of a gang goes on the first node
with enough free GPUs. The queue head blocks everything behind it (strict FIFO); backfill and preemption replace
this policy in the scheduler issue.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from chamber.common.contracts import GpuRef, JobRecord
from chamber.common.priorities import priority_value
from chamber.scheduler.core.fleet import NodeView
from chamber.scheduler.core.lifecycle import needs_placement


@dataclass(frozen=True, slots=True)
class Place:
    job_id: str
    attempt: int
    gpus: tuple[GpuRef, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: str
    reason: str


def queue_order(records: Iterable[JobRecord]) -> list[JobRecord]:
    waiting = [r for r in records if needs_placement(r)]
    return sorted(waiting, key=lambda r: (-priority_value(r.spec.priority), r.submitted_at, r.id))


def decide(fleet: Sequence[NodeView], records: Iterable[JobRecord]) -> list[Place | Wait]:
    free = {n.name: list(n.free) for n in fleet}
    decisions: list[Place | Wait] = []
    blocked = False
    for record in queue_order(records):
        if blocked:
            decisions.append(Wait(record.id, "queued behind an earlier job that does not fit yet"))
            continue
        spec = record.spec
        eligible = [
            n.name
            for n in fleet
            if (spec.pool is None or n.pool == spec.pool) and (spec.gpu_model is None or n.gpu_model == spec.gpu_model)
        ]
        picked = _first_fit(free, eligible, spec.gpus_per_replica, spec.replicas)
        if picked is None:
            decisions.append(Wait(record.id, f"waiting for {spec.replicas} x {spec.gpus_per_replica} free GPUs"))
            blocked = True
            continue
        for ref in picked:
            free[ref.node].remove(ref.index)
        nodes = sorted({ref.node for ref in picked})
        decisions.append(Place(record.id, record.attempt + 1, tuple(picked), f"placed on {', '.join(nodes)}"))
    return decisions


def _first_fit(free: dict[str, list[int]], order: list[str], per_replica: int, replicas: int) -> list[GpuRef] | None:
    taken: dict[str, int] = {}
    picked: list[GpuRef] = []
    for _ in range(replicas):
        for name in order:
            available = free[name][taken.get(name, 0) :]
            if len(available) >= per_replica:
                picked.extend(GpuRef(name, i) for i in available[:per_replica])
                taken[name] = taken.get(name, 0) + per_replica
                break
        else:
            return None
    return picked
