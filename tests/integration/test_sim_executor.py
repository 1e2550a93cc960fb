"""The simulated executor on a real JetStream: reports due together go out together, each stored once."""

import asyncio

import pytest

from chamber.common.bus import Bus, PublishError
from chamber.common.clock import SystemClock
from chamber.common.codec import Decoder
from chamber.common.contracts import JobEvent, JobFinished, JobRecord, JobSpec, JobStarted, JobState
from chamber.common.subjects import JOBS
from chamber.scheduler.executor import SimulatedExecutor
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def _record(i: int, duration_s: float | None = 0.05) -> JobRecord:
    spec = JobSpec(name=f"n{i}", team="t", gpus_per_replica=1, duration_s=duration_s)
    return JobRecord(id=f"j{i}", spec=spec, state=JobState.PENDING, submitted_at=1.0, updated_at=1.0, attempt=1)


async def _lifecycle(bus: Bus) -> list[JobEvent]:
    decoder = Decoder(JobEvent)
    return [decoder.decode(data) for data in await _stored(bus)]


async def _stored(bus: Bus) -> list[bytes]:
    out: list[bytes] = []
    info = await bus.js.stream_info(bus.names.stream(JOBS))
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        out.append((await bus.js.get_msg(bus.names.stream(JOBS), seq=seq)).data or b"")
    return out


async def test_reports_due_together_go_out_in_one_batch_each_stored_once(bus: Bus) -> None:
    await bus.ensure_streams()
    batches: list[int] = []
    publish_many = bus.publish_many

    async def counting(items):
        batches.append(len(items))
        return await publish_many(items)

    bus.publish_many = counting  # type: ignore[method-assign]
    executor = SimulatedExecutor(bus, SystemClock())
    records = [_record(i) for i in range(40)]
    await asyncio.gather(*(executor.launch(r) for r in records))
    assert batches == [40], "forty launches, one batch"
    await asyncio.gather(*(executor.launch(r) for r in records[:5]))  # a repeat: message ids drop it
    await eventually(lambda: sum(batches) == 85, what="the finish reports")
    await asyncio.sleep(0.2)
    events = await _lifecycle(bus)
    started = [e for e in events if isinstance(e, JobStarted)]
    finished = [e for e in events if isinstance(e, JobFinished)]
    assert sorted(e.job_id for e in started) == sorted(r.id for r in records)
    assert sorted(e.job_id for e in finished) == sorted(r.id for r in records)
    assert len(batches) < 2 + 40, "finishes due together share batches"
    for e in finished:
        assert e.started_at is not None
        assert e.finished_at == pytest.approx(e.started_at + 0.05), "each report keeps its own time"
    await executor.close()


async def test_a_launch_not_stored_raises_a_report_is_retried_and_a_closed_executor_refuses(bus: Bus) -> None:
    """A launch JetStream did not store fails (the scheduler logs it; the launch deadline requeues the job)
    instead of retrying for ever; a finish report is retried until stored; after close nothing is sent."""
    await bus.ensure_streams()
    refusals = {"started": 1, "finished": 1}  # the first batch of each kind is refused
    publish_many = bus.publish_many

    async def flaky(items):
        what = items[0][2]["Nats-Msg-Id"].rsplit(":", 1)[1]
        if refusals.get(what, 0) > 0:
            refusals[what] -= 1
            return [PublishError("refused") for _ in items]
        return await publish_many(items)

    bus.publish_many = flaky  # type: ignore[method-assign]
    executor = SimulatedExecutor(bus, SystemClock())
    with pytest.raises(PublishError, match="refused"):
        await executor.launch(_record(1, 0.01))  # refused once; its finish timer was not armed
    await executor.launch(_record(2, 0.01))  # stored; its finish report is refused once, then stored
    await eventually(lambda: refusals["finished"] == 0, what="the finish report refused once")
    await eventually(lambda: _has_finished(bus, "j2"), within=5.0, what="the finish report stored after a retry")
    await executor.close()
    with pytest.raises(PublishError, match="closed"):
        await executor.launch(_record(3, None))


async def _has_finished(bus: Bus, job_id: str) -> bool:
    return any(isinstance(e, JobFinished) and e.job_id == job_id for e in await _lifecycle(bus))


async def test_a_stop_at_once_cuts_a_stop_still_in_its_grace(bus: Bus) -> None:
    """A cancel, or a GPU that failed, during a preemption's checkpoint grace stops the job now (found by review:
    the second stop was dropped, and the job ran out its whole grace); a second graceful stop changes nothing."""
    from chamber.common.contracts import JobStopped

    await bus.ensure_streams()
    executor = SimulatedExecutor(bus, SystemClock())
    record = _record(1, duration_s=None)
    await executor.launch(record)
    await executor.stop(record, "preempted for hi", 600.0)
    await executor.stop(record, "a second, graceful stop", 30.0)
    await asyncio.sleep(0.1)
    assert not [e for e in await _lifecycle(bus) if isinstance(e, JobStopped)], "still in its grace"
    await executor.stop(record, "interrupted at once: GPU n1/2 failed", 0.0)

    async def stopped() -> list[JobStopped]:
        return [e for e in await _lifecycle(bus) if isinstance(e, JobStopped)]

    await eventually(stopped, what="the stop report")
    (event,) = await stopped()
    assert (event.graceful, event.reason) == (False, "interrupted at once: GPU n1/2 failed")
    await executor.close()
