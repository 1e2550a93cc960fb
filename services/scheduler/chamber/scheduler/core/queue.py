"""The queue: priority class, then preemption standing, then the team's fair share, then submit time.

Jobs are kept in sub-queues of identical (priority, standing, team, shape). Within one, later jobs can do nothing
an earlier blocked one could not (same needs, same rights), so a cycle looks only at sub-queue heads, merged in
queue order: a cycle costs O(sub-queues), not O(jobs), with 100,000 jobs waiting.

A sub-queue whose head its team's quota refuses is **parked** under (team, pool, preemptible, priority) until that
team may be admitted for such a head again (Kueue keeps inadmissible workloads aside the same way): with a
thousand teams at their quota, a cycle then walks the sub-queues that can move, not every one of them.
"""

import bisect
import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from chamber.scheduler.core.model import PendingJob, Shape

QueueKey = tuple[int, int, str, Shape]
ParkGroup = tuple[str, str, bool, int]
"""(team, pool, preemptible, priority): sub-queues whose heads the team's quota in that pool refuses."""


@dataclass
class SubQueue:
    key: QueueKey
    heap: list[tuple[float, str]] = field(default_factory=list)
    parked: ParkGroup | None = None


@dataclass
class Parking:
    order: tuple[int, int, float, float, str]
    """The queue order of its first head when parked: where the group comes up for a look in a cycle."""
    subqueues: list[tuple[int, int, SubQueue]] = field(default_factory=list)
    """(GPUs its head asked for, tie-break, sub-queue), smallest first."""

    @property
    def min_gpus(self) -> int:
        return self.subqueues[0][0] if self.subqueues else 0


class JobQueue:
    def __init__(self, standing_cap: int = 3) -> None:
        self.standing_cap = standing_cap
        self.jobs: dict[str, PendingJob] = {}
        self._subqueues: dict[QueueKey, SubQueue] = {}
        self._where: dict[str, SubQueue] = {}
        self.parked: dict[ParkGroup, Parking] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    def key_of(self, job: PendingJob) -> QueueKey:
        return (job.priority, min(job.preemptions, self.standing_cap), job.team, job.shape)

    def push(self, job: PendingJob) -> None:
        if job.id in self.jobs:
            self.remove(job.id)
        key = self.key_of(job)
        sq = self._subqueues.get(key)
        if sq is None:
            sq = self._subqueues[key] = SubQueue(key)
        heapq.heappush(sq.heap, (job.submitted_at, job.id))
        self.jobs[job.id] = job
        self._where[job.id] = sq

    def remove(self, job_id: str) -> PendingJob | None:
        """Remove a job (lazily: its heap entry is skipped when it reaches the top)."""
        self._where.pop(job_id, None)
        return self.jobs.pop(job_id, None)

    def head(self, key: QueueKey) -> PendingJob | None:
        sq = self._subqueues.get(key)
        return None if sq is None else self.head_of(sq)

    def head_of(self, sq: SubQueue) -> PendingJob | None:
        """The sub-queue's first job (skipping the lazily removed ones); an emptied sub-queue is dropped."""
        heap, where = sq.heap, self._where
        while heap:
            job_id = heap[0][1]
            if where.get(job_id) is sq:
                return self.jobs[job_id]
            heapq.heappop(heap)
        if self._subqueues.get(sq.key) is sq:
            del self._subqueues[sq.key]
        return None

    def subqueue_keys(self) -> list[QueueKey]:
        return list(self._subqueues)

    def subqueues(self) -> list[SubQueue]:
        """The sub-queues a cycle walks: every one not parked."""
        return [sq for sq in self._subqueues.values() if sq.parked is None]

    def park(self, job: PendingJob, group: ParkGroup, order: tuple[int, int, float, float, str]) -> None:
        """Set `job`'s sub-queue aside until its team's quota may admit `job` (see `wake`)."""
        sq = self._where.get(job.id)
        if sq is None or sq.parked is not None:
            return
        sq.parked = group
        parking = self.parked.get(group)
        if parking is None:
            parking = self.parked[group] = Parking(order)
        parking.order = min(parking.order, order)
        bisect.insort(parking.subqueues, (job.shape.gpus, id(sq), sq), key=lambda item: item[:2])

    def wake(self, group: ParkGroup, up_to_gpus: int | None = None) -> list[SubQueue]:
        """Back into the cycle: the group's sub-queues whose heads asked for at most `up_to_gpus` (all: None)."""
        parking = self.parked.get(group)
        if parking is None:
            return []
        n = len(parking.subqueues)
        if up_to_gpus is not None:
            n = bisect.bisect_right(parking.subqueues, up_to_gpus, key=lambda item: item[0])
        woken = [sq for _, _, sq in parking.subqueues[:n]]
        for sq in woken:
            sq.parked = None
        del parking.subqueues[:n]
        if not parking.subqueues:
            del self.parked[group]
        return woken

    def wake_all(self) -> None:
        for group in list(self.parked):
            self.wake(group)

    def is_head(self, job: PendingJob) -> bool:
        sq = self._where.get(job.id)
        return sq is not None and self.head(sq.key) is job

    def after_head(self, key: QueueKey, limit: int) -> Iterator[PendingJob]:
        """Up to `limit` jobs of a sub-queue after its head, in order (for backfill look-ahead)."""
        sq = self._subqueues.get(key)
        if sq is None:
            return
        seen = 0
        for _, job_id in heapq.nsmallest(limit + 1, sq.heap):
            if self._where.get(job_id) is not sq:
                continue
            seen += 1
            if seen == 1:
                continue
            yield self.jobs[job_id]


def order_key(job: PendingJob, standing: dict[str, float], cap: int) -> tuple[int, int, float, float, str]:
    """Smaller comes first."""
    return (-job.priority, -min(job.preemptions, cap), -standing.get(job.team, 0.0), job.submitted_at, job.id)
