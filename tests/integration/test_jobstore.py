"""The job records: compare-and-set writes, a start-up read that never misses a record, and following them."""

import asyncio
import time

import msgspec
import pytest

from chamber.common.bus import Bus
from chamber.common.contracts import JobRecord, JobState
from chamber.common.jobstore import (
    FOLLOW_INACTIVE_S,
    JOB_HISTORY,
    PLAIN_FOLLOW_INACTIVE_S,
    JobStore,
    StaleWrite,
    Write,
)
from chamber.common.subjects import JOBS_BUCKET
from tests.support.builders import make_job
from tests.support.services import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(params=["plain", "nats-py"])
async def follow_bus(request: pytest.FixtureRequest, bus: Bus) -> Bus:
    """The bus, following the records over a plain connection of its own (`OrderedReader`), or through nats-py's
    ordered consumer (what a server that asks for TLS gets)."""
    if request.param == "nats-py":
        bus.plain_url = None
    else:
        assert bus.plain_url is not None, "the tests' NATS is a plain nats:// server"
    return bus


async def test_load_all_sees_every_record_at_its_latest_revision(bus: Bus) -> None:
    store = await JobStore.open(bus)
    revisions = {}
    for i in range(300):
        record = make_job(f"j{i}").build()
        revisions[record.id] = await store.create(record)
    first = make_job("j0").build()
    revisions["j0"] = await store.update(first, revisions["j0"] or 0)
    for _ in range(5):
        loaded = await store.load_all()
        assert len(loaded) == 300, "a partial view would release live claims"
        assert {k: rev for k, (_, rev) in loaded.items()} == revisions
    with pytest.raises(StaleWrite):
        await store.update(first, 1)


async def test_history_holds_a_jobs_versions_oldest_first_and_starts_again_after_a_delete(bus: Bus) -> None:
    store = await JobStore.open(bus)
    record = make_job("h").build()
    revision = await store.create(record)
    assert revision is not None
    for state in (JobState.RUNNING, JobState.SUCCEEDED):
        record = msgspec.structs.replace(record, state=state, version=record.version + 1)
        revision = await store.update(record, revision)
    await store.create(make_job("other").build())
    assert [r.state for r in await store.history("h")] == [JobState.PENDING, JobState.RUNNING, JobState.SUCCEEDED]
    assert [r.id for r in await store.history("other")] == ["other"]
    assert await store.history("never") == []
    await store.kv.delete("h")
    assert await store.history("h") == []


async def test_a_bucket_made_keeping_one_version_keeps_the_history_once_opened(bus: Bus) -> None:
    """An upgrade: the bucket of a version that kept one version of each record keeps `JOB_HISTORY` from now on."""
    name = bus.names.bucket(JOBS_BUCKET)
    await bus.js.create_key_value(bucket=name, history=1)
    store = await JobStore.open(bus)
    info = await bus.js.stream_info(store.stream)
    assert info.config.max_msgs_per_subject == JOB_HISTORY
    record = make_job("u").build()
    revision = await store.create(record)
    await store.update(msgspec.structs.replace(record, state=JobState.RUNNING), revision or 0)
    assert len(await store.history("u")) == 2


async def test_follow_hands_over_current_records_then_every_change_and_survives_bad_entries(follow_bus: Bus) -> None:
    bus = follow_bus
    store = await JobStore.open(bus)
    revisions = {f"j{i}": await store.create(make_job(f"j{i}").build()) or 0 for i in range(3)}
    await store.kv.delete("j2")  # deleted before the follow: not handed over
    seen: list[tuple[str, str]] = []

    def on_record(record: JobRecord) -> None:
        seen.append((record.id, record.state.value))
        if record.id == "boom":
            raise RuntimeError("a follower's bug")

    stop = await store.follow(on_record)
    await eventually(lambda: len(seen) == 2)
    assert sorted(seen) == [("j0", "pending"), ("j1", "pending")]
    await store.kv.put("garbage", b"not a record")  # skipped, and the follow goes on
    await store.create(make_job("boom").build())  # its callback raises: the follow goes on
    await store.kv.delete("j0")  # a delete is no record
    await store.update(make_job("j1").running_on(("n1", 0)).build(), revisions["j1"])
    await eventually(lambda: ("j1", "running") in seen)
    assert seen[2:] == [("boom", "pending"), ("j1", "running")]
    (consumer,) = await bus.js.consumers_info(store.stream)
    if bus.plain_url is None:  # nats-py resumes the same consumer after a short disconnect: it must still be there
        assert (consumer.config.inactive_threshold or 0) >= FOLLOW_INACTIVE_S
    else:  # a new consumer is made at every reconnect: the server only removes one whose follower went for good
        assert consumer.config.inactive_threshold == PLAIN_FOLLOW_INACTIVE_S
    await stop()
    await store.create(make_job("after").build())
    await asyncio.sleep(0.3)
    assert ("after", "pending") not in seen, "stopped means stopped"


async def test_follow_after_a_snapshot_hands_over_only_later_writes(follow_bus: Bus) -> None:
    store = await JobStore.open(follow_bus)
    first = await store.create(make_job("old").build()) or 0
    stored, last = await store.snapshot()
    assert set(stored) == {"old"}
    seen: list[tuple[str, str]] = []
    stop = await store.follow(lambda r: seen.append((r.id, r.state.value)), after=last)
    await store.create(make_job("new").build())
    await store.update(make_job("old").running_on(("n1", 0)).build(), first)
    await eventually(lambda: len(seen) == 2)
    assert seen == [("new", "pending"), ("old", "running")], "what the snapshot held is not handed over again"
    await stop()


async def test_a_follower_that_falls_behind_loses_no_record(follow_bus: Bus) -> None:
    """A burst while the follower is slow: nothing may be dropped as a slow consumer (nats-py's ordered consumer
    would not notice the gap, and the record would be lost until a restart), and the server's flow control does not
    stall the follow."""
    store = await JobStore.open(follow_bus)
    latest: dict[str, str] = {}

    def slow(record: JobRecord) -> None:
        time.sleep(0.0005)
        latest[record.id] = record.state.value

    stop = await store.follow(slow)
    jobs = [make_job(f"j{i}").running_on(("n1", i % 8)).build() for i in range(400)]
    revisions = await store.write_many([Write(r, 0) for r in jobs])
    done = [
        msgspec.structs.replace(r, state=JobState.SUCCEEDED, version=r.version + 1, finished_at=r.updated_at + 1)
        for r in jobs
    ]
    assert all(isinstance(rev, int) for rev in revisions)
    await store.write_many([Write(r, rev) for r, rev in zip(done, revisions, strict=True) if isinstance(rev, int)])
    await eventually(lambda: len(latest) == 400 and set(latest.values()) == {"succeeded"}, within=20.0)
    await stop()
