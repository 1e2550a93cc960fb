"""Two schedulers, one leader: the standby takes over within the lease after the leader is SIGKILLed, and no GPU is
ever held by two jobs, no job is lost or run twice. A leader that lost its lease is fenced out of the ledger."""

import itertools
import random
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

import msgspec
import pytest
from nats.aio.msg import Msg

from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    TERMINAL_STATES,
    Decision,
    JobEvent,
    JobFinished,
    JobPlaced,
    JobRecord,
    JobSpec,
    JobState,
    JobStateChanged,
    JobSubmitted,
    SchedulerStats,
)
from chamber.common.jobstore import JobStore, Write
from chamber.common.lease import Lease
from chamber.common.ledger import LedgerFenced
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import DECISIONS, JOBS, JOBS_BUCKET, Names
from chamber.scheduler.executor import SimulatedExecutor
from chamber.scheduler.service import Scheduler
from tests.support.processes import ServiceProcesses
from tests.support.services import eventually, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

N_JOBS = 120
LEASE_S = 2.0


async def read_all(bus: Bus, stream: str, decoder: Decoder) -> list[object]:
    from chamber.common.bus import read_stream

    return [decoder.decode(msg.data) async for msg in read_stream(bus.js, stream, ">")]


async def test_the_standby_takes_over_after_the_leader_is_killed(
    settings: Settings, cleanup: None, tmp_path: Path
) -> None:
    settings = msgspec.structs.replace(settings, leader_lease_s=LEASE_S, fleet_nodes=4, gpus_per_node=8)
    procs = ServiceProcesses(settings, tmp_path)
    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    await bus.ensure_streams()
    leaders: list[SchedulerStats] = []

    async def on_stats(msg: Msg) -> None:
        leaders.append(msgspec.json.decode(msg.data, type=SchedulerStats))

    await bus.nc.subscribe(bus.names.scheduler_stats(), cb=on_stats)
    procs.start("collector")
    procs.start("scheduler")
    await eventually(lambda: bool(leaders), within=30, what="a leader reports")
    first = leaders[-1].holder
    procs.procs["standby"] = procs.procs.pop("scheduler")  # keep the leader's handle under another name
    procs.start("scheduler")  # the standby
    rng = random.Random(5)
    ids = []
    try:
        for i in range(N_JOBS):
            per, replicas = rng.choice([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)])
            spec = JobSpec(name=f"f{i}", team="t", gpus_per_replica=per, replicas=replicas,
                           duration_s=round(rng.uniform(0.3, 1.5), 2))  # fmt: skip
            job_id = f"f{i:03d}"
            ids.append(job_id)
            event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time())
            await bus.publish(bus.names.job_submit(job_id), event, msg_id=job_id)
        store = await JobStore.open(bus)

        async def finished() -> int:
            return sum(r.state == "succeeded" for r, _ in (await store.load_all()).values())

        await eventually(lambda: _at_least(finished, N_JOBS // 3), within=60, what="a third done")
        procs.kill("standby")  # the leader, SIGKILLed: its lease is never released
        killed_at = time.time()
        await eventually(lambda: leaders[-1].holder != first, within=LEASE_S + 8, what="the standby leads")
        took_over = leaders[-1].at - killed_at
        await eventually(lambda: _at_least(finished, N_JOBS), within=90, what="every job done")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
    assert took_over <= LEASE_S + 3, f"takeover took {took_over:.1f} s"
    events = await read_all(bus, bus.names.stream(JOBS), Decoder(JobEvent))
    decisions = await read_all(bus, bus.names.stream(DECISIONS), Decoder(Decision))
    versions = await read_all(bus, f"KV_{bus.names.bucket(JOBS_BUCKET)}", Decoder(JobRecord))  # every record's history
    await bus.close()
    finishes = Counter(e.job_id for e in events if isinstance(e, JobFinished))
    assert set(finishes) == set(ids), "no job lost"
    assert max(finishes.values()) == 1, "no job run to its end twice"
    changes = [JobStateChanged(record=r, previous="", at=r.updated_at) for r in versions if isinstance(r, JobRecord)]
    assert_no_gpu_held_twice([*decisions, *changes])


HISTORY = 60_000
"""Ended jobs in the bucket before the schedulers start: a cold read of them takes seconds (5.6 s per 100,000 on a
2-core machine), longer than the takeover may."""


async def test_the_standby_takes_over_within_the_lease_whatever_the_history(
    settings: Settings, cleanup: None, tmp_path: Path
) -> None:
    """The standby followed the records while it waited, so its takeover does not read the bucket's history."""
    settings = msgspec.structs.replace(settings, leader_lease_s=LEASE_S, fleet_nodes=2, gpus_per_node=8)
    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    await bus.ensure_streams()
    store = await JobStore.open(bus)
    spec = JobSpec(name="old", team="t", gpus_per_replica=1, duration_s=1.0)
    long_ago = time.time() - 2 * 86_400  # one job ended a second, for 17 hours
    for start in range(0, HISTORY, 2000):
        history = [
            JobRecord(id=f"old{i:06d}", spec=spec, state=JobState.SUCCEEDED, submitted_at=long_ago,
                      updated_at=long_ago + i, finished_at=long_ago + i, run_s=1.0, version=4)
            for i in range(start, start + 2000)
        ]  # fmt: skip
        assert all(isinstance(r, int) for r in await store.write_many([Write(r, 0) for r in history]))
    leaders: list[SchedulerStats] = []

    async def on_stats(msg: Msg) -> None:
        leaders.append(msgspec.json.decode(msg.data, type=SchedulerStats))

    await bus.nc.subscribe(bus.names.scheduler_stats(), cb=on_stats)
    procs = ServiceProcesses(settings, tmp_path)
    procs.start("collector")
    procs.start("scheduler")
    try:
        await eventually(lambda: bool(leaders), within=60, what="a leader reports")
        first = leaders[-1].holder
        procs.procs["leader"] = procs.procs.pop("scheduler")
        procs.start("scheduler")  # the standby
        await eventually(lambda: _logged(procs, "scheduler.standby_view"), within=60, what="the standby follows")
        for i in range(8):
            job = JobSubmitted(job_id=f"new{i}", spec=spec, submitted_at=time.time())
            await bus.publish(bus.names.job_submit(job.job_id), job, msg_id=job.job_id)
        procs.kill("leader")
        killed_at = time.time()
        await eventually(lambda: leaders[-1].holder != first, within=LEASE_S + 30, what="the standby leads")
        took_over = leaders[-1].at - killed_at
        starts = [float(m) for m in re.findall(r"scheduler\.started.*?took_ms=([0-9.]+)", procs.logs())]

        async def new_done() -> int:
            records = [await store.get(f"new{i}") for i in range(8)]
            return sum(1 for r in records if r is not None and r[0].state == JobState.SUCCEEDED)

        await eventually(lambda: _at_least(new_done, 8), within=30, what="the new jobs done")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
        await bus.close()
    assert took_over <= LEASE_S + 2, f"takeover took {took_over:.1f} s with {HISTORY} ended jobs in the bucket"
    cold, warm = starts  # the first leader read the bucket; the standby had followed it
    assert warm < 1000, f"start-up took {cold:.0f} ms cold and {warm:.0f} ms from the standby's view"
    assert warm * 3 < cold, f"start-up took {cold:.0f} ms cold and {warm:.0f} ms from the standby's view"


async def _logged(procs: ServiceProcesses, text: str) -> bool:
    return text in procs.logs()


def assert_no_gpu_held_twice(decisions: list[object]) -> None:
    """Each attempt holds its GPUs from its placement until the record says the attempt ended."""
    placed = {(d.job_id, d.attempt): d for d in decisions if isinstance(d, JobPlaced)}
    ended: dict[tuple[str, int], float] = {}
    for d in decisions:
        if isinstance(d, JobStateChanged):
            r = d.record
            for attempt in range(1, r.attempt + 1):
                key = (r.id, attempt)
                if key in placed and key not in ended and (r.state in TERMINAL_STATES or r.attempt > attempt
                                                           or r.placement is None):  # fmt: skip
                    ended[key] = d.at
    holds: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for key, d in placed.items():
        assert key in ended, f"attempt {key} was placed and never ended"
        for gpu in d.gpus:
            holds[gpu.slot].append((d.decided_at, ended[key], f"{key[0]}#{key[1]}"))
    for slot, intervals in holds.items():
        intervals.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(intervals):
            assert start >= end, f"{slot} held by {a} until {end} and by {b} from {start}"


async def test_a_leader_that_lost_its_lease_cannot_claim(settings: Settings, bus: Bus) -> None:
    """Leader A is paused past its lease (here: its lease key is simply taken away); B takes over. When A acts on
    what it still believes, its claims are refused by the fence, and B's state is untouched. B need not have
    written anything yet: taking the lead puts its token in the fence."""
    from chamber.collector import service as collector

    async with running(settings, ("collector", collector.main)):
        ctx = make_context(settings, "scheduler")
        quota = await QuotaStore.open(bus)
        lease_a = await Lease.open(bus, "scheduler", "a", ttl_s=30)
        assert await lease_a.try_acquire()
        ledger_a = ctx.ledger()
        ledger_a.token = lease_a.token
        a = Scheduler(ctx, bus, ledger_a, await JobStore.open(bus), SimulatedExecutor(bus, ctx.clock),
                      quota_store=quota, holder="a")  # fmt: skip
        await eventually(lambda: _inventory(bus), what="inventory")
        await a.start()
        await lease_a.kv.delete("scheduler")  # A's lease is gone (expired while it was paused)
        lease_b = await Lease.open(bus, "scheduler", "b", ttl_s=30)
        assert await lease_b.try_acquire()
        assert lease_b.token > lease_a.token
        ledger_b = ctx.ledger()
        ledger_b.token = lease_b.token
        b = Scheduler(ctx, bus, ledger_b, await JobStore.open(bus), SimulatedExecutor(bus, ctx.clock),
                      quota_store=quota, holder="b")  # fmt: skip
        await b.start()  # B has decided nothing yet: its start alone must shut A out
        spec = JobSpec(name="late", team="t", gpus_per_replica=1, duration_s=1.0)
        with pytest.raises(LedgerFenced):
            await a.on_events([JobSubmitted(job_id="late", spec=spec, submitted_at=time.time())])
        assert (await ledger_b.snapshot()).owners == {}, "A claimed nothing"
        await a.close()
        await b.close()
        await ledger_a.close()
        await ledger_b.close()


async def _inventory(bus: Bus) -> bool:
    from chamber.common.contracts import NodeInventory
    from chamber.common.subjects import INVENTORY

    return bool(await bus.read_latest(INVENTORY, bus.names.subject("inventory.>"), Decoder(NodeInventory)))


async def _at_least(counter: object, n: int) -> bool:
    return bool(await counter() >= n)  # type: ignore[operator]
