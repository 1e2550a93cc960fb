"""The job records the gateway serves from memory, newest first, with a version that changes with any record.

Fed by the jobs KV follow. A record's submit time never changes, so the order is kept by inserting each new job
once (nearly always at the end); listing the newest N is a walk from the end, not a sort of every job.

Memory is bounded by the active jobs: every job that has not ended is kept, and of those that ended only the
`keep_finished` submitted last. An older one is still served by id (`GatewayState.job` reads the KV); lists hold
the active jobs and that recent history, as `squeue` shows the queue and recent jobs while the accounting
database keeps the rest. Dropping the oldest ended job is O(1): its place in the order is left behind and skipped,
and the order is compacted once such places outnumber the rest.
"""

import bisect
import heapq
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
        self._finished: list[tuple[float, str]] = []
        """A heap of the kept jobs that ended, oldest submission first."""
        self.version = 0
        """Bumped by every change: the key of every cached answer computed from the records."""

    def __len__(self) -> int:
        return len(self.records)

    @property
    def finished(self) -> int:
        """Jobs kept that have ended."""
        return len(self._finished)

    def upsert(self, record: JobRecord) -> bool:
        """Keep `record` unless a newer version is known; True when it changed anything."""
        known = self.records.get(record.id)
        if known is not None and known.version >= record.version:
            return False
        if known is None:
            if record.id in self._dropped:
                self._dropped.discard(record.id)  # (an old job read again by id: its place is still there)
            else:
                bisect.insort(self._order, (record.submitted_at, record.id))
        self.records[record.id] = record
        self.version += 1
        if record.state in TERMINAL_STATES and (known is None or known.state not in TERMINAL_STATES):
            heapq.heappush(self._finished, (record.submitted_at, record.id))
            self._trim()
        return True

    def _trim(self) -> None:
        while len(self._finished) > self.keep_finished:
            _, job_id = heapq.heappop(self._finished)
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
