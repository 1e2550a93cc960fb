"""The queue: priority class, then preemption standing, then the team's fair share, then submit time.

Jobs are kept in sub-queues of identical (priority, standing, team, shape). Within one, later jobs can do nothing
an earlier blocked one could not (same needs, same rights), so a cycle looks only at sub-queue heads, merged in
queue order: a cycle costs O(sub-queues), not O(jobs), with 100,000 jobs waiting.
"""

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field

from chamber.scheduler.core.model import PendingJob, Shape

QueueKey = tuple[int, int, str, Shape]


@dataclass
class SubQueue:
    key: QueueKey
    heap: list[tuple[float, str]] = field(default_factory=list)


class JobQueue:
    def __init__(self, standing_cap: int = 3) -> None:
        self.standing_cap = standing_cap
        self.jobs: dict[str, PendingJob] = {}
        self._subqueues: dict[QueueKey, SubQueue] = {}
        self._where: dict[str, SubQueue] = {}

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
        if sq is None:
            return None
        while sq.heap:
            _, job_id = sq.heap[0]
            if self._where.get(job_id) is sq:
                return self.jobs[job_id]
            heapq.heappop(sq.heap)
        del self._subqueues[key]
        return None

    def subqueue_keys(self) -> list[QueueKey]:
        return list(self._subqueues)

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
