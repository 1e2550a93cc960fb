"""A standby scheduler follows the job records while it waits, so that taking over does not read the whole jobs
bucket (`chamber.scheduler.standby`), on real NATS and Redis: the view it keeps is the one a full read gives, and a
scheduler started from it decides, republishes and predicts as one started cold; when the view does not hold
every change the last leader may not have announced, the takeover reads the bucket."""

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import Decision, JobRecord, JobState, JobStateChanged
from chamber.common.jobstore import JobStore, Write
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import DECISIONS, QUOTA_BUCKET
from chamber.scheduler.core.controller import learned
from chamber.scheduler.executor.simulated import SimulatedExecutor
from chamber.scheduler.service import Scheduler
from chamber.scheduler.standby import RecordView
from tests.support.builders import make_job

pytestmark = pytest.mark.integration


def _ended(job_id: str, at: float, *, name: str = "train", run_s: float = 100.0) -> JobRecord:
    record = make_job(job_id).named(name).at(at - run_s - 10).build()
    return msgspec.structs.replace(
        record, state=JobState.SUCCEEDED, updated_at=at, finished_at=at, run_s=run_s, version=4
    )


async def _predictions(records: Sequence[JobRecord], view: RecordView) -> tuple[Any, Any]:
    full = learned(records)
    return (
        [full.predict("team-a", name, 1) for name in ("train", "eval", "other")],
        [view.predictor.predict("team-a", name, 1) for name in ("train", "eval", "other")],
    )


async def test_the_view_is_what_a_full_read_gives(bus: Bus) -> None:
    store = await JobStore.open(bus)
    for i in range(30):
        await store.create(_ended(f"old{i}", 100.0 + i, run_s=50.0 + i))
    waiting = make_job("waiting").build()
    rev = {"waiting": await store.create(waiting) or 0, "gone": await store.create(make_job("gone").build()) or 0}
    view = RecordView(store)
    await view.start()
    try:
        # writes after the view's read: a new job, one that ends, a delete, an entry that is no record
        await store.create(make_job("new").build())
        await store.update(_ended("waiting", 500.0, name="eval", run_s=7.0), rev["waiting"])
        await store.kv.delete("gone")
        await store.kv.put("garbage", b"not a record")
        await view.caught_up(timeout_s=10)
        full = await store.load_all()
        assert view.records() == full
        assert set(view.active) == {"new"}
        full_prediction, view_prediction = await _predictions([r for r, _ in full.values()], view)
        assert view_prediction == full_prediction, "the predictor learned from every job that succeeded"
    finally:
        await view.stop()


async def test_it_keeps_the_latest_ended_records_and_says_which_changes_it_covers(bus: Bus) -> None:
    store = await JobStore.open(bus)
    view = RecordView(store, keep_ended=2)
    await view.start()
    try:
        for i, at in enumerate((100.0, 200.0, 300.0)):
            await store.create(_ended(f"e{i}", at))
        await view.caught_up(timeout_s=10)
        assert list(view.ended) == ["e1", "e2"]
        assert not view.covers(100.0), "the change at 100 s is no longer kept"
        assert view.covers(100.5)
    finally:
        await view.stop()


async def _scheduler(settings: Settings, bus: Bus, view: RecordView) -> Scheduler:
    ctx = make_context(settings, "scheduler")
    quota = QuotaStore(await bus.key_value(QUOTA_BUCKET))
    store = await JobStore.open(bus)
    return Scheduler(ctx, bus, ctx.ledger(), store, SimulatedExecutor(bus, ctx.clock), quota_store=quota, view=view)


async def _announced(bus: Bus) -> set[str]:
    from chamber.common.bus import read_stream

    decoder = Decoder(Decision)
    out = set()
    async for msg in read_stream(bus.js, bus.names.stream(DECISIONS), ">"):
        decision = decoder.decode(msg.data)
        if isinstance(decision, JobStateChanged):
            out.add(decision.record.id)
    return out


@pytest.mark.parametrize("keep_ended", [100, 1], ids=["from the view", "view too short: full read"])
async def test_a_scheduler_taking_over_starts_from_the_view_or_reads_the_bucket(
    settings: Settings, bus: Bus, keep_ended: int
) -> None:
    store = await JobStore.open(bus)
    history = [_ended(f"h{i}", 1000.0 + i) for i in range(50)]
    await store.write_many([Write(r, 0) for r in history])
    await bus.publish(bus.names.decision_state("h49"), JobStateChanged(record=history[-1], previous="", at=2000.0))
    view = RecordView(store, keep_ended=keep_ended)
    await view.start()
    # the last leader's final writes, never announced (it died before publishing them)
    await store.create(make_job("pending").at(2500.0).build())
    await store.create(_ended("unannounced-a", 2600.0))
    await store.create(_ended("unannounced-b", 2700.0))
    reads: list[int] = []
    real = store.load_all

    async def counting() -> dict[str, tuple[JobRecord, int]]:
        reads.append(1)
        return await real()

    s = await _scheduler(settings, bus, view)
    s.store.load_all = counting  # type: ignore[method-assign]
    try:
        await s.start()
        assert set(s.control.records) == {"pending"}
        assert reads == ([] if keep_ended > 1 else [1]), "the bucket is read only when the view is short"
        assert {"unannounced-a", "unannounced-b", "pending"} <= await _announced(bus)
        assert s.control.state.predictor.predict("team-a", "train", 1) == learned(history).predict("team-a", "train", 1)
    finally:
        await s.close()
        await s.ledger.close()
