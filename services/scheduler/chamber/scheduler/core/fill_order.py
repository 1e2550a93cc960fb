"""A team's running jobs in one pool, kept in the order they fill its guarantee, so that which of them run on
borrowed capacity is found in one pass, without sorting them each time.

Jobs fill a team's nominal quota in order of priority (highest first), then start time, then id (as
`chamber.common.quota.borrowed_jobs` orders them); the ones beyond it are borrowing. A placement admitted by
counting the team's lower-priority work as borrowing re-marks the team's jobs in the pool: with 20 teams of ~500
jobs each, sorting them for every such placement was a sixth of a contended cycle.
"""

import bisect

from chamber.scheduler.core.model import RunningJob

FillKey = tuple[int, float, str]


def fill_key(job: RunningJob) -> FillKey:
    return (-job.priority, job.started_at, job.id)


class FillOrder:
    __slots__ = ("_jobs", "_key_of", "_keys")

    def __init__(self) -> None:
        self._keys: list[FillKey] = []
        self._jobs: list[RunningJob] = []
        self._key_of: dict[str, FillKey] = {}
        """job id -> its key when added (a job added again under its id replaces the one added before)."""

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: RunningJob) -> None:
        self.remove(job.id)
        key = self._key_of[job.id] = fill_key(job)
        at = bisect.bisect_left(self._keys, key)
        self._keys.insert(at, key)
        self._jobs.insert(at, job)

    def remove(self, job_id: str) -> None:
        key = self._key_of.pop(job_id, None)
        if key is None:
            return
        at = bisect.bisect_left(self._keys, key)
        del self._keys[at], self._jobs[at]

    def jobs(self) -> list[RunningJob]:
        """The jobs in fill order."""
        return list(self._jobs)

    def mark_borrowed(self, nominal: int | None) -> None:
        """Mark each job borrowed when it runs beyond `nominal` in fill order (one pass); None: no quota, none is."""
        if nominal is None:
            for job in self._jobs:
                job.borrowed = False
            return
        total = 0
        for job in self._jobs:
            total += len(job.gpus)
            job.borrowed = total > nominal
