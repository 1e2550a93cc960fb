"""A simulated executor: a placed job starts at once and finishes after its `duration_s`.

Jobs without a duration run until cancelled. After a restart, `resync` re-arms the finish timers from the
records' start times, so a job finishes when it would have, not later.
"""

import asyncio
from collections.abc import Iterable

from chamber.common.bus import Bus, PublishError
from chamber.common.clock import Clock
from chamber.common.contracts import JobFinished, JobRecord, JobStarted, JobState, JobStopped
from chamber.common.log import get_logger

log = get_logger(__name__)


class SimulatedExecutor:
    def __init__(self, bus: Bus, clock: Clock) -> None:
        self.bus = bus
        self.clock = clock
        self._timers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._stopping: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._started: dict[tuple[str, int], float] = {}

    async def launch(self, record: JobRecord) -> None:
        started_at = self._started.setdefault((record.id, record.attempt), self.clock.now())
        await self.bus.publish(
            self.bus.names.job_lifecycle(record.id),
            JobStarted(job_id=record.id, attempt=record.attempt, started_at=started_at),
            msg_id=f"{record.id}:{record.attempt}:started",
        )
        self._arm(record, started_at)

    async def stop(self, record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
        key = (record.id, record.attempt)
        if key in self._stopping:
            return
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
        while True:
            try:
                await self.bus.publish(
                    self.bus.names.job_lifecycle(record.id), event, msg_id=f"{record.id}:{record.attempt}:{what}"
                )
                return
            except PublishError as exc:
                log.warning("sim_executor.publish_failed", job_id=record.id, error=str(exc))
                await asyncio.sleep(0.5)

    async def resync(self, records: Iterable[JobRecord]) -> None:
        for record in records:
            if record.placement is None:
                continue
            if record.cancel_requested:
                await self.stop(record, "cancelled")
            elif record.stopping:
                if record.started_at is not None:
                    self._arm(record, record.started_at)
                grace = max(0.0, record.updated_at + record.spec.checkpoint_grace_s - self.clock.now())
                await self.stop(record, record.stop_reason, grace if record.stop_kind == "preempt" else 0.0)
            elif record.state == JobState.RUNNING and record.started_at is not None:
                self._arm(record, record.started_at)
            else:
                await self.launch(record)

    async def close(self) -> None:
        for task in [*self._timers.values(), *self._stopping.values()]:
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
        self._timers[key] = asyncio.create_task(self._finish_at(record, finish_at), name=f"sim-{record.id}")

    async def _finish_at(self, record: JobRecord, finish_at: float) -> None:
        await asyncio.sleep(max(0.0, finish_at - self.clock.now()))
        key = (record.id, record.attempt)
        event = JobFinished(
            job_id=record.id, attempt=record.attempt, finished_at=finish_at, started_at=self._started.get(key)
        )
        await self._report(record, event, "finished")
        self._timers.pop(key, None)
        self._started.pop(key, None)
