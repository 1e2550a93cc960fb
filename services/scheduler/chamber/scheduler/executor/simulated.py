"""A simulated executor: a placed job starts at once and finishes after its `duration_s`.

Jobs without a duration run until cancelled. After a restart, `resync` re-arms the finish timers from the
records' start times, so a job finishes when it would have, not later.

Reports due within `REPORT_WINDOW_S` of each other go out together: one write and one wait for their acks, not
one per job (at a thousand jobs a second the per-publish round trips were most of what this executor cost the
scheduler's process). Each report carries its own time, so only its delivery moves, by at most the window.

A running job's finish is a timer of the event loop, and its report joins the next batch from there, retried by
the batch until JetStream stores it: no task and no awaiting coroutine per job (with a task sleeping until each
job's end and then awaiting its report, launch and finish cost 81-84 us of CPU a job, against 65-72 us now, with
8 launches every 5 ms and a bus that acks at once).
"""

import asyncio
from collections.abc import Callable, Iterable

import msgspec

from chamber.common.bus import Bus, BusError, PublishError
from chamber.common.clock import Clock
from chamber.common.codec import encode
from chamber.common.contracts import JobFinished, JobRecord, JobStarted, JobState, JobStopped
from chamber.common.log import get_logger
from chamber.scheduler.core.lifecycle import grace_left

log = get_logger(__name__)

REPORT_WINDOW_S = 0.005


Item = tuple[str, bytes, dict[str, str] | None]
RETRY_S = 0.5


class _Outbox:
    """Reports waiting for the next batch, and each one's outcome once it went out. A report nobody awaits (a
    finish) has its `settled` callback instead, called with its outcome."""

    def __init__(self, done: "asyncio.Future[None]") -> None:
        self.items: list[Item] = []
        self.settled: list[Callable[[object], None] | None] = []
        self.results: list[object] = []
        self.done = done


class SimulatedExecutor:
    def __init__(self, bus: Bus, clock: Clock) -> None:
        self.bus = bus
        self.clock = clock
        self._timers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        """Each running job's finish, due at its end."""
        self._stopping: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._started: dict[tuple[str, int], float] = {}
        self._outbox: _Outbox | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._closed = False

    async def launch(self, record: JobRecord) -> None:
        started_at = self._started.setdefault((record.id, record.attempt), self.clock.now())
        event = JobStarted(job_id=record.id, attempt=record.attempt, started_at=started_at)
        await self._send(record, event, "started", retry=False)
        self._arm(record, started_at)

    async def stop(self, record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
        """Stop after `grace_s` (the job checkpoints meanwhile). A second stop may only cut the grace: one at once
        (a cancel, a GPU that failed meanwhile) stops a job still in its grace now."""
        key = (record.id, record.attempt)
        waiting = self._stopping.get(key)
        if waiting is not None:
            if grace_s > 0 or waiting.done():
                return
            del self._stopping[key]
            waiting.cancel()
        if grace_s <= 0:
            await self._stop_now(record, reason, graceful=False)
            return
        self._stopping[key] = asyncio.create_task(self._stop_after(record, reason, grace_s), name=f"stop-{record.id}")

    async def _stop_after(self, record: JobRecord, reason: str, grace_s: float) -> None:
        """The job checkpoints during its grace period; it may also finish in it, which the scheduler then sees."""
        await asyncio.sleep(grace_s)
        await self._stop_now(record, reason, graceful=True)
        self._stopping.pop((record.id, record.attempt), None)

    async def _stop_now(self, record: JobRecord, reason: str, graceful: bool) -> None:
        timer = self._timers.pop((record.id, record.attempt), None)
        if timer is not None:
            timer.cancel()
        self._started.pop((record.id, record.attempt), None)
        event = JobStopped(
            job_id=record.id, attempt=record.attempt, stopped_at=self.clock.now(), reason=reason, graceful=graceful,
            started_at=self._started.get((record.id, record.attempt), record.started_at),
        )  # fmt: skip
        await self._report(record, event, "stopped")

    async def _report(self, record: JobRecord, event: JobStarted | JobFinished | JobStopped, what: str) -> None:
        """Publish a report, retrying until JetStream stores it (the message id makes retries harmless)."""
        await self._send(record, event, what, retry=True)

    async def _send(self, record: JobRecord, event: msgspec.Struct, what: str, *, retry: bool) -> None:
        """Publish `event` with the other reports of this window; raises PublishError if it was not stored,
        unless `retry`, which tries again until it is."""
        subject = self.bus.names.job_lifecycle(record.id)
        item = (subject, encode(event), {"Nats-Msg-Id": f"{record.id}:{record.attempt}:{what}"})
        while True:
            if self._closed:
                raise PublishError(f"publish to {subject}: the executor is closed")
            outbox = self._enqueue(item, None)
            index = len(outbox.items) - 1
            await asyncio.shield(outbox.done)
            result = outbox.results[index]
            if not isinstance(result, BusError):
                return
            if not retry:
                raise PublishError(f"publish to {subject}: {result}")
            log.warning("sim_executor.publish_failed", job_id=record.id, error=str(result))
            await asyncio.sleep(0.5)

    def _enqueue(self, item: Item, settled: Callable[[object], None] | None) -> _Outbox:
        """Add a report to the batch going out next (started here if there is none)."""
        outbox = self._outbox
        if outbox is None:
            outbox = self._outbox = _Outbox(asyncio.get_running_loop().create_future())
            task = asyncio.create_task(self._flush(outbox), name="sim-executor-reports")
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        outbox.items.append(item)
        outbox.settled.append(settled)
        return outbox

    async def _flush(self, outbox: _Outbox) -> None:
        closed = PublishError("the executor closed before the report went out")
        try:
            await asyncio.sleep(REPORT_WINDOW_S)
            if self._outbox is outbox:
                self._outbox = None
            outbox.results = list(await self.bus.publish_many(outbox.items))
        finally:
            if self._outbox is outbox:
                self._outbox = None
            if len(outbox.results) != len(outbox.items):
                outbox.results = [closed] * len(outbox.items)
            outbox.done.set_result(None)
            for settled, result in zip(outbox.settled, outbox.results, strict=True):
                if settled is not None:
                    settled(result)

    async def resync(self, records: Iterable[JobRecord]) -> None:
        for record in records:
            if record.placement is None:
                continue
            if record.cancel_requested:
                await self.stop(record, "cancelled")
            elif record.stopping:
                if record.started_at is not None:
                    self._arm(record, record.started_at)
                await self.stop(record, record.stop_reason, grace_left(record, self.clock.now()))
            elif record.state == JobState.RUNNING and record.started_at is not None:
                self._arm(record, record.started_at)
            else:
                await self.launch(record)

    async def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        for task in [*self._stopping.values(), *self._flushes]:
            task.cancel()
        self._timers.clear()
        self._stopping.clear()

    def _arm(self, record: JobRecord, started_at: float) -> None:
        key = (record.id, record.attempt)
        self._started.setdefault(key, started_at)
        if key in self._timers or record.spec.duration_s is None:
            return
        remaining = max(0.0, record.spec.duration_s - record.run_s)
        finish_at = started_at + remaining
        delay = max(0.0, finish_at - self.clock.now())
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._finished, record, finish_at)

    def _finished(self, record: JobRecord, finish_at: float) -> None:
        """A job's end: its report goes out with the next batch, again until it is stored (its message id makes a
        repeat harmless); the job counts as running here until then (a stop in between still finds its timer)."""
        key = (record.id, record.attempt)
        if self._closed or key not in self._timers:
            return  # stopped since
        event = JobFinished(
            job_id=record.id, attempt=record.attempt, finished_at=finish_at, started_at=self._started.get(key)
        )
        item = (
            self.bus.names.job_lifecycle(record.id),
            encode(event),
            {"Nats-Msg-Id": f"{record.id}:{record.attempt}:finished"},
        )

        def settled(result: object) -> None:
            if self._timers.get(key) is not handle:
                return  # stopped or closed meanwhile
            if isinstance(result, BusError):
                log.warning("sim_executor.publish_failed", job_id=record.id, error=str(result))
                self._timers[key] = asyncio.get_running_loop().call_later(RETRY_S, self._finished, record, finish_at)
                return
            del self._timers[key]
            self._started.pop(key, None)

        handle = self._timers[key]
        self._enqueue(item, settled)
