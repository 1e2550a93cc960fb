"""A standby scheduler follows the job records while it waits, so that taking over does not read the whole jobs
bucket (`chamber.scheduler.standby`), on real NATS and Redis: the view it keeps is the one a full read gives, and a
scheduler started from it decides, republishes and predicts as one started cold; when the view does not hold
every change the last leader may not have announced, the takeover reads the bucket."""

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from chamber.common.bus import Bus, BusError
from chamber.common.codec import Decoder
from chamber.common.contracts import Decision, JobPlaced, JobRecord, JobState
from chamber.common.jobstore import JobStore, StaleWrite, Write
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import DECISIONS, JOBS_BUCKET
from chamber.scheduler.core.controller import learned
from chamber.scheduler.executor.simulated import SimulatedExecutor
from chamber.scheduler.service import Scheduler
from chamber.scheduler.standby import RecordView
from tests.support.builders import make_job
from tests.support.services import eventually

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


async def test_it_keeps_the_latest_ended_records(bus: Bus) -> None:
    store = await JobStore.open(bus)
    view = RecordView(store, keep_ended=2)
    await view.start()
    try:
        for i, at in enumerate((100.0, 200.0, 300.0)):
            await store.create(_ended(f"e{i}", at))
        await view.caught_up(timeout_s=10)
        assert list(view.ended) == ["e1", "e2"]
    finally:
        await view.stop()


async def _writer(store: JobStore, stop: asyncio.Event, revs: dict[str, int], n_keys: int = 200) -> int:
    """Random creates, updates, ends and deletes until stopped."""
    rnd = random.Random(7)
    writes = 0
    i = 0
    while not stop.is_set():
        batch = []
        for _ in range(20):
            i += 1
            key = f"k{rnd.randrange(n_keys)}"
            if key in revs and rnd.random() < 0.05:
                await store.kv.delete(key)
                revs.pop(key, None)
                continue
            if key in revs:
                rec = (
                    _ended(key, 1000.0 + i, run_s=float(i % 50))
                    if rnd.random() < 0.3
                    else make_job(key).at(1000.0 + i).build()
                )
                batch.append(Write(rec, revs[key]))
            else:
                batch.append(Write(make_job(key).at(1000.0 + i).build(), 0))
        results = await store.write_many(batch)
        for w, r in zip(batch, results, strict=True):
            if isinstance(r, int):
                revs[w.record.id] = r
                writes += 1
            elif isinstance(r, StaleWrite):
                got = await store.get(w.record.id)
                if got is None:
                    revs.pop(w.record.id, None)
                else:
                    revs[w.record.id] = got[1]
        await asyncio.sleep(0)
    return writes


@pytest.mark.parametrize("n", [300, 3000])
async def test_view_equals_full_read_with_writes_racing_the_snapshot_and_follow(bus: Bus, n: int) -> None:
    """From the review: a writer runs during the view's first read and during the follow; after caught_up the view
    (records and revisions) is exactly load_all, and every active revision is the key's current KV revision."""
    store = await JobStore.open(bus)
    revs: dict[str, int] = {}
    stop = asyncio.Event()
    await store.write_many([Write(make_job(f"k{i}").build(), 0) for i in range(n)])
    revs.update({k: r for k, (_, r) in (await store.load_all()).items()})
    task = asyncio.create_task(_writer(store, stop, revs, n_keys=n))
    await asyncio.sleep(0.2)
    view = RecordView(store)
    await view.start()
    try:
        await asyncio.sleep(1.0)
        stop.set()
        assert await task > 0
        await view.caught_up(timeout_s=10)
        full = await store.load_all()
        assert view.records() == full
        for job_id, (_, rev) in view.active.items():
            entry = await store.kv.get(job_id)
            assert entry.revision == rev
    finally:
        stop.set()
        await view.stop()


async def test_view_survives_its_consumer_being_deleted_and_does_not_replay_the_bucket(bus: Bus) -> None:
    """Found by review. The follow's server-side consumer is lost (a NATS restart loses ordered consumers, a pause
    past the inactive threshold deletes them): nats-py recreates it from its last delivered sequence + 1, which
    is 1 when it had delivered nothing yet. The view stays right, and the whole bucket that comes again is
    skipped before it is decoded."""
    store = await JobStore.open(bus)
    for i in range(200):
        await store.create(make_job(f"k{i}").build())
    view = RecordView(store)
    calls: list[int] = []
    real = view._on_entry

    def counting(job_id: str, record: JobRecord | None, seq: int) -> None:
        calls.append(seq)
        real(job_id, record, seq)

    view._on_entry = counting  # type: ignore[method-assign]
    await view.start()
    try:
        (consumer,) = [c for c in await bus.js.consumers_info(store.stream) if c.config.deliver_subject]
        await bus.js.delete_consumer(store.stream, consumer.name)
        await asyncio.sleep(12)  # two missed heartbeats, then nats-py recreates it
        await store.create(make_job("after").build())
        await eventually(lambda: "after" in view.active, within=20)
        await view.caught_up(timeout_s=5)
        assert view.records() == await store.load_all(), "the view is still right after the reset"
        assert [s for s in calls if s <= 200] == [], f"replayed {len([s for s in calls if s <= 200])} old entries"
    finally:
        await view.stop()


async def test_caught_up_when_the_streams_last_message_is_gone(bus: Bus) -> None:
    """Found by review. The stream's last message removed before the follow delivered it (a stream purge of that
    subject, as an operator's `nats stream purge --subject` does; KV streams deny single deletes): last_seq stays
    and the follow never delivers it. caught_up waited its whole timeout (30 s at takeover); it now asks whether
    any write it has not seen is left."""
    store = await JobStore.open(bus)
    await store.create(make_job("a").build())
    view = RecordView(store)
    await view.start()
    await view.stop()  # the follow lags (stopped here to make the race deterministic) ...
    await store.create(make_job("e").build())
    e_seq = await store.last_sequence()
    await bus.js.purge_stream(store.stream, subject=f"{store.prefix}e")  # ... while e's message is removed
    assert await store.last_sequence() == e_seq
    view._stop = await store.follow_entries(view._on_entry, after=view.seen)  # ... and catches up
    started = time.monotonic()
    try:
        await view.caught_up(timeout_s=3)
    except BusError as exc:
        pytest.fail(f"caught_up waited {time.monotonic() - started:.1f} s and failed: {exc}")
    finally:
        await view.stop()


async def test_the_predictor_counts_a_success_once_even_when_many_end_during_the_first_read(bus: Bus) -> None:
    """Found by review. More ended records written between the first read's starting sequence and its end than the
    view keeps: the follow hands them over again (sequence > that start), and the ones evicted while the read was
    taken in were observed a second time (and kept again in place of later ones). The same write is taken in once."""
    store = await JobStore.open(bus)
    real = store.load_all

    async def racing() -> dict[str, tuple[JobRecord, int]]:
        # the live leader writes while the standby reads the bucket
        for i in range(5):
            await store.create(_ended(f"e{i}", 100.0 + i, run_s=10.0 * (i + 1)))
        return await real()

    store.load_all = racing  # type: ignore[method-assign]
    view = RecordView(store, keep_ended=2)
    await view.start()
    try:
        await view.caught_up(timeout_s=5)
        full = await real()
        cold = learned(r for r, _ in full.values())
        assert view.predictor.observed == cold.observed, (view.predictor.observed, cold.observed)
    finally:
        await view.stop()


@pytest.mark.parametrize("history", [1, 5])
async def test_a_success_written_during_the_first_read_is_counted_once_whatever_the_buckets_history(
    bus: Bus, history: int
) -> None:
    """From the review: a job written twice (created, then ended) while the first read runs. A bucket that keeps
    more than one write a key (one made elsewhere with history > 1 is opened as it is) also hands over the earlier
    write to the follow; it must not make the read's own write of the job be taken in a second time."""
    kv = await bus.js.create_key_value(bucket=bus.names.bucket(JOBS_BUCKET), history=history)
    store = JobStore(kv, bus)
    real = store.load_all

    async def racing() -> dict[str, tuple[JobRecord, int]]:
        rev = await store.create(make_job("j").build()) or 0
        await store.update(_ended("j", 500.0, run_s=10.0), rev)
        return await real()

    store.load_all = racing  # type: ignore[method-assign]
    view = RecordView(store)
    await view.start()
    try:
        await view.caught_up(timeout_s=5)
        cold = learned(r for r, _ in (await real()).values())
        assert view.predictor.observed == cold.observed
        assert view.records() == await real()
    finally:
        await view.stop()


async def test_a_takeover_does_not_wait_for_a_follow_that_stands_still(bus: Bus) -> None:
    """Found by `make chaos`: after a NATS restart the follow's consumer is gone until nats-py notices missed
    heartbeats (seconds), and a leader taking over waited for it (the harness then froze that leader too, and
    jobs waited 12 s). A follow that takes in nothing while writes it has not seen are stored is given up at
    once: the takeover reads the bucket instead, as a cold start does."""

    async def nothing() -> None:
        return None

    store = await JobStore.open(bus)
    view = RecordView(store)
    await view.start()
    stop, view._stop = view._stop, nothing
    assert stop is not None
    await stop()  # the follow's consumer is gone
    await store.create(make_job("later").build())
    started = time.monotonic()
    with pytest.raises(BusError, match="stands still"):
        await view.caught_up(timeout_s=10)
    assert time.monotonic() - started < 2


async def _scheduler(settings: Settings, bus: Bus, view: RecordView) -> Scheduler:
    ctx = make_context(settings, "scheduler")
    quota = await QuotaStore.open(bus)
    store = await JobStore.open(bus)
    return Scheduler(ctx, bus, ctx.ledger(), store, SimulatedExecutor(bus, ctx.clock), quota_store=quota, view=view)


async def _announced(bus: Bus) -> set[str]:
    from chamber.common.bus import read_stream

    decoder = Decoder(Decision)
    out = set()
    async for msg in read_stream(bus.js, bus.names.stream(DECISIONS), ">"):
        decision = decoder.decode(msg.data)
        if isinstance(decision, JobPlaced):
            out.add(decision.job_id)
    return out


@pytest.mark.parametrize("keep_ended", [100, 1], ids=["ended records kept", "one ended record kept"])
async def test_a_scheduler_taking_over_starts_from_the_view_and_announces_what_was_not(
    settings: Settings, bus: Bus, keep_ended: int
) -> None:
    store = await JobStore.open(bus)
    history = [_ended(f"h{i}", 1000.0 + i) for i in range(50)]
    await store.write_many([Write(r, 0) for r in history])
    last = JobPlaced(job_id="h49", attempt=1, gpus=[], reason="", decided_at=2000.0)
    await bus.publish(bus.names.decision_placed("h49"), last)
    view = RecordView(store, keep_ended=keep_ended)
    await view.start()
    # the last leader's final writes, their placements never announced (it died before publishing them)
    await store.create(make_job("pending").at(2500.0).build())
    await store.create(make_job("unannounced-running").at(2600.0).running_on(("node-0", 0)).build())
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
        assert set(s.control.records) == {"pending", "unannounced-running"}
        assert reads == [], "the view holds every active record: all that a takeover publishes again"
        assert "unannounced-running" in await _announced(bus)
        assert s.control.state.predictor.predict("team-a", "train", 1) == learned(history).predict("team-a", "train", 1)
    finally:
        await s.close()
        await s.ledger.close()
