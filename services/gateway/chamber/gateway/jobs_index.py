"""The job records the gateway serves, in memory, newest first, with a version that changes with any record.

Fed by the jobs KV watcher. A record's submit time never changes, so the order is kept by inserting each new job
once (nearly always at the end); listing the newest N is a walk from the end, not a sort of every job.
"""

import bisect
from collections.abc import Iterator

from chamber.common.contracts import JobRecord, JobState


class JobsIndex:
    def __init__(self) -> None:
        self.records: dict[str, JobRecord] = {}
        self._order: list[tuple[float, str]] = []
        self.version = 0
        """Bumped by every change: the key of every cached answer computed from the records."""

    def __len__(self) -> int:
        return len(self.records)

    def upsert(self, record: JobRecord) -> bool:
        """Keep `record` unless a newer version is known; True when it changed anything."""
        known = self.records.get(record.id)
        if known is not None and known.version >= record.version:
            return False
        if known is None:
            bisect.insort(self._order, (record.submitted_at, record.id))
        self.records[record.id] = record
        self.version += 1
        return True

    def newest(self) -> Iterator[JobRecord]:
        for _, job_id in reversed(self._order):
            yield self.records[job_id]

    def select(
        self,
        *,
        limit: int,
        state: JobState | None = None,
        team: str | None = None,
        teams: frozenset[str] | None = None,
    ) -> list[JobRecord]:
        """Newest first: at most `limit` records in `state`, of `team`, among `teams` (None: any)."""
        out: list[JobRecord] = []
        for r in self.newest():
            if (
                (state is None or r.state == state)
                and (team is None or r.spec.team == team)
                and (teams is None or r.spec.team in teams)
            ):
                out.append(r)
                if len(out) >= limit:
                    break
        return out
