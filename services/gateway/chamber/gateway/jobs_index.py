"""The job records the gateway serves from memory, newest first, with a version that changes with any record.

Fed by the jobs KV follow. A record's submit time never changes, so the order is kept by inserting each new job
once (nearly always at the end); listing the newest N is a walk from the end, not a sort of every job.

Memory is bounded by the active jobs: every job that has not ended is kept, and of those that ended only the
`keep_finished` that ended last. An older one is still served by id (`GatewayState.job` reads the KV); lists hold
the active jobs and that recent history, as `squeue` shows the queue and recent jobs while the accounting
database keeps the rest. A job that has just ended is always kept (however long ago it was submitted), so the
gateway still knows that it gave its GPUs back. Dropping the job that ended first is O(1): its place in the order
is left behind and skipped, and the order is compacted once such places outnumber the rest.
"""

import bisect
import itertools
from collections import deque
from collections.abc import Iterator

from chamber.common.contracts import TERMINAL_STATES, JobRecord, JobState

KEEP_FINISHED = 50_000
COMPACT_AT = 1024
"""Left-behind places in the order, at least, before it is compacted (and then only once they outnumber the rest)."""


class JobsIndex:
    def __init__(self, keep_finished: int = KEEP_FINISHED) -> None:
        self.keep_finished = keep_finished
        self.records: dict[str, JobRecord] = {}
        self._order: list[tuple[float, str]] = []
        """(submit time, id) of every kept job, and of jobs dropped since the last compaction (skipped)."""
        self._dropped: set[str] = set()
        """Jobs dropped whose place in `_order` is still there."""
        self._ended: deque[tuple[int, str]] = deque()
        """(end number, id) of the ended jobs kept, in the order they ended; an entry whose number is no longer
        the job's (it became active again) is skipped."""
        self._end_of: dict[str, int] = {}
        """Ended job kept -> its end number."""
        self._ends = itertools.count()
        self.version = 0
        """Bumped by every change: the key of every cached answer computed from the records."""

    def __len__(self) -> int:
        return len(self.records)

    @property
    def finished(self) -> int:
        """Jobs kept that have ended."""
        return len(self._end_of)

    def upsert(self, record: JobRecord) -> bool:
        """Keep `record` unless a newer version is known; True when it changed anything."""
        known = self.records.get(record.id)
        if known is not None and known.version >= record.version:
            return False
        if known is None:
            if record.id in self._dropped:
                self._dropped.discard(record.id)  # (a dropped job delivered again: its place is still there)
            else:
                bisect.insort(self._order, (record.submitted_at, record.id))
        self.records[record.id] = record
        self.version += 1
        if record.state not in TERMINAL_STATES:
            self._end_of.pop(record.id, None)
        elif record.id not in self._end_of:
            end = next(self._ends)
            self._end_of[record.id] = end
            self._ended.append((end, record.id))
            self._trim()
        return True

    def refresh(self, record: JobRecord) -> bool:
        """A record read by id (from the KV): taken only for a job held here. A job new here comes with the follow,
        and an ended job dropped long ago, read again, is not recent history (nor may an older read bring back
        as active a job whose end was dropped)."""
        return record.id in self.records and self.upsert(record)

    def _trim(self) -> None:
        while len(self._end_of) > self.keep_finished:
            end, job_id = self._ended.popleft()
            if self._end_of.get(job_id) != end:
                continue
            del self._end_of[job_id]
            del self.records[job_id]
            self._dropped.add(job_id)
        if len(self._dropped) >= COMPACT_AT and 2 * len(self._dropped) > len(self._order):
            self._order = [entry for entry in self._order if entry[1] not in self._dropped]
            self._dropped.clear()

    def newest(self) -> Iterator[JobRecord]:
        records, dropped = self.records, self._dropped
        for _, job_id in reversed(self._order):
            if job_id not in dropped:
                yield records[job_id]

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
