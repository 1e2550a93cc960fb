"""The scheduler service after a step fails part way, on real NATS and Redis: a new leader fences the old one at
once, a failed or unanswered ledger call and a publish that did not get through leave no job lost, unannounced or
stuck, and GPUs freed from orphan claims at start-up are usable.

Faults are injected at the adapter boundary (the ledger's or the bus's call raises, before or after its effect);
the scheduler, the store, the ledger and the bus are the real ones."""

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from chamber.common.bus import Bus, BusError
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    Decision,
    GpuDevice,
    JobFinished,
    JobRecord,
    JobSpec,
    JobStarted,
    JobStateChanged,
    JobSubmitted,
    Node,
    NodeInventory,
    Pool,
)
from chamber.common.jobstore import JobStore
from chamber.common.lease import Lease, LeaseLost
from chamber.common.ledger import Claim, Ledger, LedgerUnavailable
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import DECISIONS, QUOTA_BUCKET
from chamber.scheduler.core.lifecycle import holds_gpus
from chamber.scheduler.executor.simulated import SimulatedExecutor
from chamber.scheduler.service import Scheduler

pytestmark = pytest.mark.integration

NODES = ("node-a", "node-b")


@pytest.fixture
async def fleet(bus: Bus) -> None:
    """Two nodes of 8 GPUs in the inventory."""
    pool = Pool(name="default", gpu_model="H100")
    for name in NODES:
        gpus = [GpuDevice(index=i, uuid=f"GPU-{name}-{i}", model="H100") for i in range(8)]
        inventory = NodeInventory(node=Node(name=name, pool="default", gpus=gpus), pool=pool, observed_at=time.time())
        await bus.publish(bus.names.inventory(name), inventory)


@pytest.fixture
async def ledger(settings: Settings) -> AsyncIterator[Ledger]:
    led = make_context(settings, "scheduler").ledger()
    yield led
    await led.close()


async def _scheduler(settings: Settings, bus: Bus, ledger: Ledger) -> Scheduler:
    """A scheduler whose job events are fed by the test (its own consumer stopped), as the consumer would."""
    ctx = make_context(settings, "scheduler")
    quota = QuotaStore(await bus.key_value(QUOTA_BUCKET))
    s = Scheduler(ctx, bus, ledger, await JobStore.open(bus), SimulatedExecutor(bus, ctx.clock), quota_store=quota)
    await s.start()
    assert s.consumer is not None
    await s.consumer.stop()
    return s


def _submit(job_id: str) -> JobSubmitted:
    spec = JobSpec(name=job_id, team="t", gpus_per_replica=8)
    return JobSubmitted(job_id=job_id, spec=spec, submitted_at=time.time())


async def _record(s: Scheduler, job_id: str) -> JobRecord | None:
    got = await s.store.get(job_id)
    return None if got is None else got[0]


async def _claims_match_records(s: Scheduler, ledger: Ledger) -> None:
    """Every claim in the ledger is the placement of a record that holds GPUs, and the other way round."""
    snap = await ledger.snapshot()
    stored = await s.store.load_all()
    held = {
        job_id: (r.attempt, tuple(g.slot for g in r.placement.gpus))
        for job_id, (r, _) in stored.items()
        if r.placement is not None and holds_gpus(r)
    }
    assert {j: (c.attempt, c.slots) for j, c in snap.claims.items()} == held


def _once(real: Callable[..., Awaitable[Any]], *, after: bool = False, exc: Exception) -> Callable[..., Any]:
    """`real`, except that its first call raises `exc` (after doing its work, with `after`)."""
    calls = {"n": 0}

    async def call(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1 and not after:
            raise exc
        result = await real(*args, **kwargs)
        if calls["n"] == 1:
            raise exc
        return result

    return call


async def test_a_ledger_error_mid_batch_loses_no_job(settings: Settings, bus: Bus, fleet: None, ledger: Ledger) -> None:
    """Redis fails the claim of a batch whose submission was already applied in memory: the batch fails, and
    its redelivery places and stores the job (it used to be acked with the job in memory only, never stored)."""
    s = await _scheduler(settings, bus, ledger)
    ledger.release_and_claim = _once(ledger.release_and_claim, exc=LedgerUnavailable("blip"))  # type: ignore[method-assign]
    with pytest.raises(LedgerUnavailable):
        await s.on_events([_submit("x")])
    await s.on_events([_submit("x")])  # the consumer redelivers it
    x = await _record(s, "x")
    assert x is not None
    assert holds_gpus(x), "the job is stored and placed"
    await s.on_events([_submit("y")])
    assert (await _record(s, "y")) is not None
    await _claims_match_records(s, ledger)
    await s.close()


async def test_a_claim_applied_but_unanswered_is_launched(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The ledger applies a pass's claim but its answer is lost: the job's record must come to say so (it used to
    stay pending with its GPUs claimed, never launched, until a restart)."""
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([_submit("a"), _submit("b")])
    await s.on_events([JobStarted(job_id="a", attempt=1, started_at=time.time())])
    await s.on_events([_submit("x")])  # waits: the fleet is full
    timeout = LedgerUnavailable("Timeout reading from socket")  # what the adapter makes of redis' TimeoutError
    ledger.release_and_claim = _once(ledger.release_and_claim, after=True, exc=timeout)  # type: ignore[method-assign]
    done = JobFinished(job_id="a", attempt=1, finished_at=time.time(), started_at=None)
    with pytest.raises(LedgerUnavailable):
        await s.on_events([done])
    await s.on_events([done])  # redelivered
    x = await _record(s, "x")
    assert x is not None
    assert holds_gpus(x), "x is placed in the store as in the ledger"
    await _claims_match_records(s, ledger)
    await s.close()


async def test_changes_stored_but_not_published_are_announced(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The records of a batch are written, then publishing their changes fails: the redelivered batch finds
    nothing to apply, and the change must still reach DECISIONS (quota and the agents act on it)."""
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([_submit("x")])
    await s.on_events([JobStarted(job_id="x", attempt=1, started_at=time.time())])
    real = bus.publish_many
    failing = True

    async def publish_many(items: Sequence[tuple[str, bytes, dict[str, str] | None]]) -> list[Any]:
        if failing and any(".decisions." in subject for subject, _, _ in items):
            return [BusError("publish timed out") for _ in items]
        return await real(items)

    bus.publish_many = publish_many  # type: ignore[method-assign]
    done = JobFinished(job_id="x", attempt=1, finished_at=time.time(), started_at=None)
    with pytest.raises(BusError):
        await s.on_events([done])
    failing = False
    await s.on_events([done])  # redelivered
    latest = await bus.read_latest(DECISIONS, bus.names.decision_state("x"), Decoder(Decision))
    assert isinstance(latest[-1], JobStateChanged)
    assert latest[-1].record.state == "succeeded"
    await s.close()


async def test_gpus_of_orphan_claims_are_free_after_start(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """A crash between a claim and its record left a claim no record explains: start-up releases it, and its
    GPUs must be free in the state too (they used to stay out of it until the next restart)."""
    await ledger.rebuild([])
    await ledger.claim_many([Claim("ghost", 1, tuple(f"node-a/{i}" for i in range(8)))])
    s = await _scheduler(settings, bus, ledger)
    assert (await ledger.snapshot()).claims == {}
    await s.on_events([_submit("a1"), _submit("a2")])
    for job_id in ("a1", "a2"):
        r = await _record(s, job_id)
        assert r is not None
        assert holds_gpus(r), f"{job_id} placed: both nodes are free"
    await s.close()


async def test_a_launch_deadline_that_could_not_be_reported_is_tried_again(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """A placed job that never started gives its GPUs back at its launch deadline, through the bus. If that
    publish fails the deadline stays armed (it used to be forgotten: the job kept its GPUs for good)."""
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([_submit("x")])
    assert "x" in s.starting
    late = time.time() + settings.launch_timeout_s + 1
    bus.publish = _once(bus.publish, exc=BusError("no responders"))  # type: ignore[method-assign]
    await s._launch_deadlines(late)
    assert "x" in s.starting, "still armed after the failed report"
    await s._launch_deadlines(late)
    assert "x" not in s.starting
    await s.close()


async def test_a_launch_that_failed_is_tried_again_not_left_to_the_deadline(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The executor's launch raised (NATS restarting as it published the job's start): the job used to stay placed
    and never started until its launch deadline (5 minutes by default), holding its GPUs. The next pass of the
    scheduler's loop launches it again."""
    import asyncio

    from chamber.common.subjects import JOBS

    s = await _scheduler(settings, bus, ledger)
    s.executor.launch = _once(s.executor.launch, exc=BusError("nats: connection closed"))  # type: ignore[method-assign]
    await s.on_events([_submit("x")])
    for _ in range(100):
        if not s._executing:
            break
        await asyncio.sleep(0.02)
    assert await bus.last_message(JOBS, bus.names.job_lifecycle("x")) is None, "the launch failed"
    stop = asyncio.Event()
    loop = asyncio.create_task(s.run(stop))
    try:
        subject = bus.names.job_lifecycle("x")
        for _ in range(150):
            if await bus.last_message(JOBS, subject) is not None:
                break
            await asyncio.sleep(0.05)
        started = await bus.last_message(JOBS, subject)
        assert started is not None, "launched again: its start was reported"
        assert b"JobStarted" in started or b'"started_at"' in started
    finally:
        stop.set()
        await loop
        await s.close()


async def test_a_deposed_leader_does_not_rebuild_a_wiped_ledger(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """Redis lost everything, the fence included, while leader A was paused past its lease. A finds the ledger
    empty; rebuilding it is the one write no fence can refuse, so A must first prove it still leads (it used to
    rebuild the ledger from its stale records and claim on it)."""
    ctx = make_context(settings, "scheduler")
    lease = await Lease.open(bus, "scheduler", "a", ttl_s=30)
    assert await lease.try_acquire()
    ledger.token = lease.token
    quota = QuotaStore(await bus.key_value(QUOTA_BUCKET))
    a = Scheduler(ctx, bus, ledger, await JobStore.open(bus), SimulatedExecutor(bus, ctx.clock), quota_store=quota,
                  holder="a", confirm_lead=lease.renew)  # fmt: skip
    await a.start()
    assert a.consumer is not None
    await a.consumer.stop()
    await lease.kv.delete("scheduler")  # A's lease expired while it was paused; B leads now
    b = await Lease.open(bus, "scheduler", "b", ttl_s=30)
    assert await b.try_acquire()
    await ledger.redis.delete(ledger.k_ready, ledger.k_fence, ledger.k_owner, ledger.k_claims)  # Redis wiped
    with pytest.raises(LeaseLost):
        await a.on_events([_submit("late")])
    snap = await ledger.snapshot()
    assert not snap.ready, "A did not rebuild the ledger"
    assert snap.claims == {}
    await a.close()


async def test_a_leader_deposed_between_its_claim_and_its_write_launches_nothing(
    settings: Settings, bus: Bus, fleet: None
) -> None:
    """Leader A claims a node for job x, then pauses past its lease before writing x's record. B takes over: it
    takes the fence, releases A's claim as an orphan and places its own jobs on both nodes. A wakes and writes x as
    placed: it must then publish and launch nothing (x's GPUs are B's jobs'; it used to launch x onto them), and
    B, handed x's submission again, must give the stored placement back rather than keep or launch it."""
    from chamber.common.contracts import JobEvent, JobLaunchFailed
    from chamber.common.ledger import LedgerFenced
    from chamber.common.subjects import JOBS

    quota = QuotaStore(await bus.key_value(QUOTA_BUCKET))
    launched: dict[str, list[str]] = {"a": [], "b": []}

    async def leader(name: str) -> tuple[Scheduler, Ledger]:
        ctx = make_context(settings, "scheduler")
        lease = await Lease.open(bus, "scheduler", name, ttl_s=30)
        assert await lease.try_acquire()
        led = ctx.ledger()
        led.token = lease.token
        executor = SimulatedExecutor(bus, ctx.clock)
        real_launch = executor.launch

        async def launch(record: JobRecord) -> None:
            launched[name].append(record.id)
            await real_launch(record)

        executor.launch = launch  # type: ignore[method-assign]
        s = Scheduler(ctx, bus, led, await JobStore.open(bus), executor, quota_store=quota, holder=name,
                      confirm_lead=lease.renew)  # fmt: skip
        await s.start()
        assert s.consumer is not None
        await s.consumer.stop()
        return s, led

    a, ledger_a = await leader("a")
    b_side: list[tuple[Scheduler, Ledger]] = []
    real_write = a.store.write_many

    async def paused_write(writes: Any) -> Any:
        if not b_side and any(w.record.id == "x" and w.record.placement is not None for w in writes):
            lease_kv = (await Lease.open(bus, "scheduler", "a", ttl_s=30)).kv
            await lease_kv.delete("scheduler")  # A's lease ran out while it was paused
            b_side.append(await leader("b"))
            await b_side[0][0].on_events([_submit("y1"), _submit("y2")])  # both nodes, x's included
        return await real_write(writes)

    a.store.write_many = paused_write  # type: ignore[method-assign]
    with pytest.raises(LedgerFenced):
        await a.on_events([_submit("x")])
    b, ledger_b = b_side[0]
    stored = await _record(b, "x")
    assert stored is not None
    assert holds_gpus(stored), "A's late write landed: x is stored as placed"
    assert "x" not in (await ledger_b.snapshot()).claims
    assert launched["a"] == [], "A launched nothing after it was deposed"
    placed = await bus.read_latest(DECISIONS, bus.names.decision_placed("x"), Decoder(Decision))
    assert placed == [], "A announced no placement of x"

    await b.on_events_again([_submit("x")])  # never acked by A: redelivered to B
    await b._check_ledger()  # B's next pass compares the ledger with what it took from the store
    lost = await bus.last_message(JOBS, bus.names.job_lifecycle("x"))
    assert lost is not None
    event = Decoder(JobEvent).decode(lost)
    assert isinstance(event, JobLaunchFailed)
    await b.on_events([event])
    x = await _record(b, "x")
    assert x is not None
    assert not holds_gpus(x), "x gave the placement back and waits: both nodes are y1's and y2's"
    assert "x" not in launched["b"]
    await _claims_match_records(b, ledger_b)
    await a.close()
    await b.close()
    await ledger_a.close()
    await ledger_b.close()
