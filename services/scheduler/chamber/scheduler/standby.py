"""What a standby scheduler keeps while it waits for the lease: the job records as they are written, so that taking
over does not start with reading the whole jobs bucket.

The bucket keeps every job ever run (ended ones included: the API serves them, the quota service's budgets and
fair share are computed from them), and a scheduler starting cold reads all of it: 100,000 ended records took
5.6 s to read on a 2-core machine, so a standby's takeover grew slower with every job the cluster ran. A
standby reads the bucket once, when it starts, then follows every write; at takeover, after taking the fence, it
only waits until it has seen every write up to the stream's end as it is then (a few milliseconds), which is the
same view a full read would give.

It keeps what a takeover needs: every active record (with its revision, for compare-and-set; the new leader
publishes again the placements the old one wrote and may not have announced, and only an active record holds
one), the most recent ended ones (so that a success written again is not learned twice), and a runtime predictor
that has learned from every job that succeeded (those of its first read in the order they finished, as a full
read relearns them, then in the order their records were written).
Memory is bounded by the active jobs and `KEEP_ENDED`. A record removed by purging the bucket's stream directly
(not through the KV API, whose delete and purge leave a marker the view takes in) stays in the view.
"""

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from chamber.common.bus import BusError
from chamber.common.contracts import TERMINAL_STATES, JobRecord, JobState
from chamber.common.jobstore import JobStore
from chamber.common.log import get_logger
from chamber.scheduler.core.controller import learned, observe
from chamber.scheduler.core.estimates import RuntimePredictor

log = get_logger(__name__)

STALL_S = 0.5
"""How long the follow may take in nothing, while writes it has not seen are stored, before a takeover reads the
bucket instead (a healthy follow hands a write over within milliseconds)."""
KEEP_ENDED = 5000
"""Ended records kept, the latest written: at a thousand jobs a second, the last five seconds of them."""

Stored = dict[str, tuple[JobRecord, int]]


class RecordView:
    def __init__(self, store: JobStore, *, keep_ended: int = KEEP_ENDED) -> None:
        self.store = store
        self.keep_ended = keep_ended
        self.active: Stored = {}
        self.ended: OrderedDict[str, tuple[JobRecord, int]] = OrderedDict()
        """The latest ended records, oldest written first."""
        self.predictor = RuntimePredictor()
        self.seen = 0
        """The stream sequence of the last write taken in."""
        self._progress = asyncio.Event()
        self._stop: Callable[[], Awaitable[None]] | None = None
        self._read: dict[str, int] = {}
        """Entries of the first read written after the sequence it started from (the follow starts there too):
        job -> revision, so that the same write handed over again is not taken in twice (a success observed
        twice, an ended record kept again in place of a later one)."""

    async def start(self) -> None:
        """Read the bucket (once), then follow every write after that read."""
        stored, last = await self.store.snapshot()
        self.predictor = learned(record for record, _ in stored.values())
        for job_id, (record, revision) in stored.items():
            self._keep(job_id, record, revision)
            if revision > last:  # written during the read: the follow hands it over again
                self._read[job_id] = revision
        self.seen = last
        self._stop = await self.store.follow_entries(self._on_entry, after=last)

    async def stop(self) -> None:
        if self._stop is not None:
            await self._stop()
            self._stop = None

    def _on_entry(self, job_id: str, record: JobRecord | None, seq: int) -> None:
        if seq <= self.seen:
            return  # (the follow hands each write over once, in order; nothing older is taken again)
        self.seen = seq
        read = self._read.get(job_id) if self._read else None
        if read is not None and seq <= read:  # the first read took it in already, or a later write of the job
            if seq == read:  # (a bucket keeping more than one write a key hands over the earlier ones too)
                del self._read[job_id]
            self._progress.set()
            return
        before = self.active.get(job_id) or self.ended.get(job_id)
        if (
            record is not None
            and record.state == JobState.SUCCEEDED
            and (before is None or before[0].state != JobState.SUCCEEDED)
        ):
            observe(self.predictor, record)
        self._keep(job_id, record, seq)
        self._progress.set()

    def _keep(self, job_id: str, record: JobRecord | None, revision: int) -> None:
        self.active.pop(job_id, None)
        self.ended.pop(job_id, None)
        if record is None:
            return
        if record.state not in TERMINAL_STATES:
            self.active[job_id] = (record, revision)
            return
        self.ended[job_id] = (record, revision)
        while len(self.ended) > self.keep_ended:
            self.ended.popitem(last=False)

    async def caught_up(self, timeout_s: float = 10.0, stall_s: float = STALL_S) -> None:
        """Wait until every write up to the stream's end, as it is now, is taken in. Raises BusError (the caller
        then reads the bucket instead) when that takes longer than `timeout_s`, or when the follow takes in
        nothing for `stall_s` while writes it has not seen are stored: a follow whose consumer was lost (a NATS
        restart) is only recreated by nats-py after missed heartbeats, and a takeover waiting for it stood still
        for seconds (found by `make chaos`, when the leader that took over was frozen in turn)."""
        last = await self.store.last_sequence()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.seen < last:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or self._stop is None:
                raise BusError(f"the standby's view of the job records is behind: at {self.seen} of {last}")
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), timeout=min(left, stall_s))
            except TimeoutError:
                if not await self.store.written_between(self.seen, last):
                    return  # the writes it has not seen were removed since (an operator's purge): none is left
                raise BusError(
                    f"the standby's view of the job records stands still: at {self.seen} of {last}"
                ) from None

    def records(self) -> Stored:
        return {**self.ended, **self.active}
