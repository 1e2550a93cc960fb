"""The scheduler service after a step fails part way, on real NATS and Redis: a new leader fences the old one at
once, a failed or unanswered ledger call and a publish that did not get through leave no job lost, unannounced or
stuck, and GPUs freed from orphan claims at start-up are usable.

Faults are injected at the adapter boundary (the ledger's or the bus's call raises, before or after its effect);
the scheduler, the store, the ledger and the bus are the real ones."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import msgspec
import pytest

from chamber.common.bus import Bus, BusError
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    Cordon,
    Decision,
    GpuDevice,
    GpuRef,
    JobCancelRequested,
    JobEvent,
    JobFinished,
    JobLaunchFailed,
    JobPlaced,
    JobRecord,
    JobSpec,
    JobStarted,
    JobState,
    JobStopped,
    JobSubmitted,
    Node,
    NodeInventory,
    Placement,
    Pool,
)
from chamber.common.jobstore import JobStore, StaleWrite
from chamber.common.lease import Lease, LeaseLost
from chamber.common.ledger import Claim, Ledger, LedgerFenced, LedgerNotReady, LedgerUnavailable
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import DECISIONS, JOBS
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
    quota = await QuotaStore.open(bus)
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


async def test_placements_stored_but_not_published_are_announced(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The records of a batch are written, then publishing its placement fails: the redelivered batch finds
    nothing to apply, and the placement must still reach DECISIONS (the record's change is in its history)."""
    s = await _scheduler(settings, bus, ledger)
    real = bus.publish_many
    failing = True

    async def publish_many(items: Sequence[tuple[str, bytes, dict[str, str] | None]]) -> list[Any]:
        if failing and any(".decisions." in subject for subject, _, _ in items):
            return [BusError("publish timed out") for _ in items]
        return await real(items)

    bus.publish_many = publish_many  # type: ignore[method-assign]
    with pytest.raises(BusError):
        await s.on_events([_submit("x")])
    failing = False
    await s.on_events([_submit("x")])  # redelivered
    placed = await bus.read_since(DECISIONS, bus.names.decision_placed("x"), 0, Decoder(JobPlaced))
    assert [p.attempt for p in placed] == [1]
    history = await s.store.history("x")
    assert [(r.state.value, r.attempt) for r in history] == [("pending", 1)], "placed, written once"
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
    quota = await QuotaStore.open(bus)
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


async def _leader(
    settings: Settings,
    bus: Bus,
    name: str,
    launched: dict[str, list[tuple[str, int]]],
    *,
    stopped: list[tuple[str, int, str]] | None = None,
    trusts_lease_s: float | None = None,
) -> tuple[Scheduler, Ledger]:
    """A scheduler holding the lease as `name`, with its own ledger client; its launches are noted in `launched`,
    its stops in `stopped`. With `trusts_lease_s`, it trusts its lease for that long after confirming it (a test
    cannot freeze it for half a real lease)."""
    ctx = make_context(settings, "scheduler")
    lease = await Lease.open(bus, "scheduler", name, ttl_s=30)
    assert await lease.try_acquire()
    led = ctx.ledger()
    led.token = lease.token
    executor = SimulatedExecutor(bus, ctx.clock)
    real_launch = executor.launch

    async def launch(record: JobRecord) -> None:
        launched.setdefault(name, []).append((record.id, record.attempt))
        await real_launch(record)

    executor.launch = launch  # type: ignore[method-assign]
    if stopped is not None:
        real_stop = executor.stop

        async def stop(record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
            stopped.append((record.id, record.attempt, reason))
            await real_stop(record, reason, grace_s)

        executor.stop = stop  # type: ignore[method-assign]
    fresh = None if trusts_lease_s is None else (lambda: lease.fresh(trusts_lease_s))
    quota = await QuotaStore.open(bus)
    s = Scheduler(ctx, bus, led, await JobStore.open(bus), executor, quota_store=quota, holder=name,
                  confirm_lead=lease.renew, lead_fresh=fresh)  # fmt: skip
    await s.start()
    assert s.consumer is not None
    await s.consumer.stop()
    return s, led


async def _depose(settings: Settings, bus: Bus, launched: dict[str, list[tuple[str, int]]]) -> tuple[Scheduler, Ledger]:
    """A's lease ran out while it was paused: B takes over."""
    await (await Lease.open(bus, "scheduler", "a", ttl_s=30)).kv.delete("scheduler")
    return await _leader(settings, bus, "b", launched)


async def _run_for(s: Scheduler, seconds: float) -> None:
    """Its run loop (full cycles, relaunches, ledger checks) for `seconds`; raises what ended the loop early."""
    stop = asyncio.Event()
    loop = asyncio.create_task(s.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await loop


async def _drain(s: Scheduler) -> None:
    for _ in range(100):
        if not s._executing:
            return
        await asyncio.sleep(0.02)


def _on_node(job_id: str, priority: str, *, started: float | None, node: str = "node-a") -> JobRecord:
    """A record holding all of `node`: running since `started`, or placed and not started (None)."""
    gpus = [GpuRef(node, i) for i in range(8)]
    spec = JobSpec(name=job_id, team="t", gpus_per_replica=8, priority=priority, duration_s=3600)
    state = JobState.PENDING if started is None else JobState.RUNNING
    return JobRecord(id=job_id, spec=spec, state=state, submitted_at=time.time() - 100, updated_at=time.time() - 100,
                     attempt=1, placement=Placement(attempt=1, gpus=gpus), started_at=started)  # fmt: skip


def _pause_before_writing(a: Scheduler, job_id: str, takeover: Callable[[], Awaitable[None]]) -> None:
    """A is paused just before the write that places `job_id`, and B takes over (`takeover`) meanwhile."""
    real_write = a.store.write_many
    done: list[bool] = []

    async def paused_write(writes: Any) -> Any:
        if not done and any(w.record.id == job_id and w.record.placement is not None for w in writes):
            done.append(True)
            await takeover()
        return await real_write(writes)

    a.store.write_many = paused_write  # type: ignore[method-assign]


async def test_a_leader_deposed_between_its_claim_and_its_write_launches_nothing(
    settings: Settings, bus: Bus, fleet: None
) -> None:
    """Leader A claims a node for job x, then pauses past its lease before writing x's record. B takes over: it
    takes the fence, releases A's claim as an orphan and places its own jobs on both nodes. A wakes and writes x as
    placed: it must then publish and launch nothing (x's GPUs are B's jobs'; it used to launch x onto them), and
    B, handed x's submission again, must give the stored placement back rather than keep or launch it."""
    launched: dict[str, list[tuple[str, int]]] = {}
    a, ledger_a = await _leader(settings, bus, "a", launched)
    b_side: list[tuple[Scheduler, Ledger]] = []

    async def takeover() -> None:
        b_side.append(await _depose(settings, bus, launched))
        await b_side[0][0].on_events([_submit("y1"), _submit("y2")])  # both nodes, x's included

    _pause_before_writing(a, "x", takeover)
    with pytest.raises(LedgerFenced):
        await a.on_events([_submit("x")])
    await _drain(a)
    assert a.fenced.is_set(), "A knows it no longer leads"
    b, ledger_b = b_side[0]
    stored = await _record(b, "x")
    assert stored is not None
    assert holds_gpus(stored), "A's late write landed: x is stored as placed"
    assert "x" not in (await ledger_b.snapshot()).claims
    assert "a" not in launched, "A launched nothing after it was deposed"
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
    assert ("x", 1) not in launched.get("b", [])
    await _claims_match_records(b, ledger_b)
    for s in (a, b):
        await s.close()
    await ledger_a.close()
    await ledger_b.close()


@pytest.mark.parametrize("fault", ["fenced-in-refresh", "redis-unreachable", "redis-wiped"])
async def test_a_deposed_leader_launches_nothing_whatever_step_fails_first(
    settings: Settings, bus: Bus, fleet: None, fault: str
) -> None:
    """As above, but the pass fails before its claims are confirmed: a stale write of another job whose claim A
    then tries to release (refused by the fence inside the write step), A's Redis unreachable, or Redis restarted
    empty. What the pass wrote used to be launched anyway (`on_events` executes what was written even when a later
    step fails); unconfirmed, it waits for a pass that confirms it, which a deposed leader never has."""
    launched: dict[str, list[tuple[str, int]]] = {}
    a, ledger_a = await _leader(settings, bus, "a", launched)
    b_side: list[tuple[Scheduler, Ledger]] = []

    async def takeover() -> None:
        b_side.append(await _depose(settings, bus, launched))
        await b_side[0][0].on_events([_submit("y1"), _submit("y2"), _submit("d")])  # d waits: the fleet is full
        if fault == "redis-unreachable":
            unreachable = LedgerUnavailable("Connection refused")
            ledger_a.claim_many = _once(ledger_a.claim_many, exc=unreachable)  # type: ignore[method-assign]
        elif fault == "redis-wiped":
            await ledger_a.redis.delete(ledger_a.k_ready, ledger_a.k_fence, ledger_a.k_owner, ledger_a.k_claims)

    _pause_before_writing(a, "x", takeover)
    events = [_submit("x"), _submit("d")] if fault == "fenced-in-refresh" else [_submit("x")]
    with pytest.raises((LedgerFenced, LedgerUnavailable, LedgerNotReady)):
        await a.on_events(events)
    await _drain(a)
    assert ("x", 1) not in launched.get("a", []), "A launched x onto GPUs it no longer held"
    for s in (a, *[b for b, _ in b_side]):
        await s.close()
    await ledger_a.close()
    for _, led in b_side:
        await led.close()


async def test_a_launch_tried_again_is_confirmed_first(settings: Settings, bus: Bus, fleet: None) -> None:
    """A's launch of x failed (NATS restarting), so its loop tries it again. A is paused past its lease meanwhile;
    B gives x's placement back and fills both nodes. When A's loop wakes it must not launch x (it used to: launches
    tried again were not confirmed)."""
    launched: dict[str, list[tuple[str, int]]] = {}
    a, ledger_a = await _leader(settings, bus, "a", launched)
    await _run_for(a, 0.3)  # A leads for a moment: its periodic ledger check is not due when it wakes
    a.executor.launch = _once(a.executor.launch, exc=BusError("nats: connection closed"))  # type: ignore[method-assign]
    await a.on_events([_submit("x")])
    await _drain(a)
    assert a._relaunch == {"x": 1}
    b, ledger_b = await _depose(settings, bus, launched)
    failed = JobLaunchFailed(job_id="x", attempt=1, failed_at=time.time(), reason="did not start")
    await b.on_events([failed, _submit("y1"), _submit("y2")])
    launched.pop("a", None)
    with pytest.raises(LedgerFenced):
        await _run_for(a, 0.5)  # A wakes
    await _drain(a)
    assert "a" not in launched, "A tried x/1 again on GPUs B gave to y1 and y2"
    for s in (a, b):
        await s.close()
    await ledger_a.close()
    await ledger_b.close()


async def test_passes_that_only_wait_cost_no_extra_round_trip(settings: Settings, bus: Bus, fleet: None) -> None:
    """The fence is touched by a pass that preempts without claiming or releasing, not by every pass that decides
    (waits are decisions too: a busy queue would pay a Redis round trip per batch and per cycle)."""
    launched: dict[str, list[tuple[str, int]]] = {}
    a, ledger_a = await _leader(settings, bus, "a", launched)
    await a.on_events([_submit("r1"), _submit("r2")])  # the fleet is full
    calls = {"take_fence": 0, "claim_many": 0}
    for name in calls:
        real = getattr(ledger_a, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(ledger_a, name, counted)
    for i in range(20):
        await a.on_events([_submit(f"w{i}")])  # each waits
    await _run_for(a, 1.0)  # full cycles decide the waiting jobs again
    assert calls == {"take_fence": 0, "claim_many": 0}
    await a.close()
    await ledger_a.close()


async def test_a_leader_frozen_past_its_lease_acks_no_event_before_proving_its_lead(
    settings: Settings, bus: Bus, fleet: None
) -> None:
    """Leader A is frozen past its lease; B takes over and starts job x. A wakes holding x's finish, fetched
    before it froze: x is a job A never heard of, so applying the finish changes nothing, and A used to ack it:
    lost to B, x ran on for ever. A whose lease was not confirmed lately proves its lead before it acks."""
    launched: dict[str, list[tuple[str, int]]] = {}
    a, ledger_a = await _leader(settings, bus, "a", launched, trusts_lease_s=0.2)
    b, ledger_b = await _depose(settings, bus, launched)
    await b.on_events([_submit("x")])
    await asyncio.sleep(0.3)  # A's lease was confirmed longer ago than it trusts
    finished = JobFinished(job_id="x", attempt=1, finished_at=time.time(), started_at=None)
    with pytest.raises(LeaseLost):
        await a.on_events([finished])  # raised: the consumer redelivers it (to B), it does not ack it
    assert a.fenced.is_set()
    for s in (a, b):
        await s.close()
    await ledger_a.close()
    await ledger_b.close()


async def _wipe(led: Ledger) -> None:
    """Redis restarted empty (or was flushed): the fence is gone with everything else."""
    await led.redis.delete(led.k_ready, led.k_fence, led.k_owner, led.k_claims)


async def test_a_frozen_leader_proves_its_lead_by_its_lease_even_when_redis_lost_the_fence(
    settings: Settings, bus: Bus, fleet: None
) -> None:
    """As above, but Redis lost everything after B took over: the fence alone would take A's old token again, and A
    acked x's finish and executed x's cancel. The lease (in NATS) says who leads."""
    launched: dict[str, list[tuple[str, int]]] = {}
    stopped: list[tuple[str, int, str]] = []
    a, ledger_a = await _leader(settings, bus, "a", launched, stopped=stopped, trusts_lease_s=0.2)
    await a.on_events([_submit("r")])
    await a.on_events([JobStarted(job_id="r", attempt=1, started_at=time.time())])
    b, ledger_b = await _depose(settings, bus, launched)
    await b.on_events([_submit("x")])
    await _wipe(ledger_a)
    await asyncio.sleep(0.3)
    finished = JobFinished(job_id="x", attempt=1, finished_at=time.time(), started_at=None)
    with pytest.raises(LeaseLost):
        await a.on_events([finished])  # not acked: redelivered to B
    with pytest.raises(LeaseLost):
        await a.on_events([JobCancelRequested(job_id="r", requested_at=time.time())])
    await _drain(a)
    assert stopped == [], "A stopped nothing"
    for s in (a, b):
        await s.close()
    await ledger_a.close()
    await ledger_b.close()


async def test_a_placement_taken_over_from_a_stale_write_is_announced(
    settings: Settings, bus: Bus, fleet: None
) -> None:
    """A places j (its claim made before B took the fence) and writes it after B read the records. B places j too;
    its write is refused as stale, it takes A's placement (its claim stands), launches it, and must announce it:
    the placement used to be dropped with B's own refused one, and no JobPlaced was ever published for j."""
    launched: dict[str, list[tuple[str, int]]] = {}
    a, ledger_a = await _leader(settings, bus, "a", launched)
    await a.on_events([_submit("y1"), _submit("y2")])  # both nodes
    await a.on_events([_submit("j")])  # waits
    b_side: list[tuple[Scheduler, Ledger]] = []

    async def takeover() -> None:
        b_side.append(await _depose(settings, bus, launched))

    _pause_before_writing(a, "j", takeover)
    with pytest.raises(LedgerFenced):
        await a.on_events([JobFinished(job_id="y1", attempt=1, finished_at=time.time(), started_at=None)])
    b, ledger_b = b_side[0]
    with contextlib.suppress(StaleWrite):
        await b.on_events([_submit("w")])
    await _run_for(b, 1.5)
    await _drain(b)
    assert ("j", 1) in launched.get("b", []), "B launched j"
    placed = await bus.read_latest(DECISIONS, bus.names.decision_placed("j"), Decoder(Decision))
    assert placed, "j's placement was announced"
    for s in (a, b):
        await s.close()
    await ledger_a.close()
    await ledger_b.close()


async def test_a_running_job_whose_gpus_the_ledger_gives_another_is_interrupted(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """Two records run on the same GPUs and the ledger backs one of them (what a deposed leader's late write could
    leave): the new leader cannot make the other's claim again, so it interrupts that job (back to the queue, to
    resume from its checkpoint) instead of leaving two jobs on the GPUs; it used to only log it."""
    now = time.time()
    store = await JobStore.open(bus)
    for job_id in ("backed", "unbacked"):
        assert await store.create(_on_node(job_id, "train", started=now)) is not None
    await ledger.rebuild([])
    await ledger.claim_many([Claim("backed", 1, tuple(f"node-a/{i}" for i in range(8)))])
    stopped: list[tuple[str, int, str]] = []
    s, led = await _leader(settings, bus, "a", {}, stopped=stopped)
    await _run_for(s, 1.0)
    await _drain(s)
    assert [(job_id, attempt) for job_id, attempt, _ in stopped] == [("unbacked", 1)]
    assert "claimed by another job" in stopped[0][2]
    unbacked = await _record(s, "unbacked")
    assert unbacked is not None
    assert unbacked.stopping
    assert unbacked.stop_kind == "interrupt"
    backed = await _record(s, "backed")
    assert backed is not None
    assert backed.state == JobState.RUNNING
    assert not backed.stopping
    assert set((await ledger.snapshot()).claims) == {"backed"}, "the ledger still backs the job it backed"
    # Stopped, it goes back to the queue and runs again on the other node: node-a stays the backed job's alone.
    await s.on_events([JobStopped(job_id="unbacked", attempt=1, stopped_at=time.time(), started_at=now)])
    await _drain(s)
    again = await _record(s, "unbacked")
    assert again is not None
    assert again.attempt == 2
    assert again.placement is not None
    assert {g.node for g in again.placement.gpus} == {"node-b"}
    await _claims_match_records(s, ledger)
    assert s.control.state.holder.get("node-a/0") == "backed"
    await s.close()
    await led.close()


async def test_the_job_the_ledger_does_not_back_is_interrupted_not_taken_as_a_victim(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The first pass after start-up must not choose the unbacked job as a preemption victim: stopping it frees no
    GPU (the backed job holds them), so the preemptor would wait on it for nothing."""
    now = time.time()
    store = await JobStore.open(bus)
    urgent = JobRecord(id="p", spec=JobSpec(name="p", team="t", gpus_per_replica=8, priority="research"),
                       state=JobState.PENDING, submitted_at=now, updated_at=now)  # fmt: skip
    for record in (
        _on_node("a-unbacked", "best-effort", started=now - 100),
        _on_node("z-backed", "best-effort", started=now - 100),
        _on_node("c", "train", started=now - 100, node="node-b"),  # not a victim for p
        urgent,
    ):
        assert await store.create(record) is not None
    await ledger.rebuild([])
    await ledger.claim_many([Claim("z-backed", 1, tuple(f"node-a/{i}" for i in range(8))),
                             Claim("c", 1, tuple(f"node-b/{i}" for i in range(8)))])  # fmt: skip
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([])
    unbacked, backed, p = await _record(s, "a-unbacked"), await _record(s, "z-backed"), await _record(s, "p")
    assert unbacked is not None
    assert unbacked.stop_kind == "interrupt"
    assert backed is not None
    assert backed.stopping, "the job on the GPUs is the one preempted for p"
    assert p is not None
    assert p.waiting_for == ["z-backed/1"]
    await s.close()


async def test_where_two_lost_claims_meet_the_running_job_keeps_its_gpus(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """Both claims were lost (Redis lost its last writes): the running job's is restored, not that of a placement
    that never started (which gives its placement back and waits again, having lost no work)."""
    store = await JobStore.open(bus)
    assert await store.create(_on_node("placed", "best-effort", started=None)) is not None  # read first
    assert await store.create(_on_node("runs", "best-effort", started=time.time() - 100)) is not None
    await ledger.rebuild([])
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([])
    runs = await _record(s, "runs")
    assert runs is not None
    assert not runs.stopping
    assert set((await ledger.snapshot()).claims) == {"runs"}
    failed = await bus.read_since(JOBS, bus.names.job_lifecycle("placed"), 0.0, Decoder(JobEvent))
    assert any(isinstance(e, JobLaunchFailed) for e in failed), "the placement is given back"
    await s.close()


async def test_a_wiped_ledger_is_rebuilt_when_two_running_records_name_one_gpu(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """Redis lost everything and two running records name node-a: the rebuild backs the one running longest and
    the other is interrupted (the rebuild used to be refused, and the scheduler failed to start, again and again)."""
    store = await JobStore.open(bus)
    assert await store.create(_on_node("newer", "best-effort", started=time.time() - 10)) is not None
    assert await store.create(_on_node("older", "best-effort", started=time.time() - 100)) is not None
    s = await _scheduler(settings, bus, ledger)  # the ledger is not ready: wiped
    await s.on_events([])
    assert set((await ledger.snapshot()).claims) == {"older"}
    newer = await _record(s, "newer")
    assert newer is not None
    assert newer.stop_kind == "interrupt"
    assert s.control.state.holder.get("node-a/0") == "older"
    await s.close()


async def test_a_wiped_ledger_backs_the_job_that_is_not_already_being_stopped(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The job "older" was found unbacked and is being interrupted when Redis loses everything: the rebuild backs
    "newer" (the job the ledger backed before), not the older one, or both jobs on the GPUs would lose their work."""
    store = await JobStore.open(bus)
    older = msgspec.structs.replace(_on_node("older", "best-effort", started=time.time() - 100), stopping=True,
                                    stop_kind="interrupt", stop_reason="interrupted: unbacked")  # fmt: skip
    assert await store.create(older) is not None
    assert await store.create(_on_node("newer", "best-effort", started=time.time() - 10)) is not None
    s = await _scheduler(settings, bus, ledger)  # the ledger is not ready: wiped
    await s.on_events([])
    assert set((await ledger.snapshot()).claims) == {"newer"}
    newer = await _record(s, "newer")
    assert newer is not None
    assert not newer.stopping
    await s.close()


@pytest.mark.parametrize("wiped", [False, True], ids=["claims lost", "ledger wiped"])
async def test_a_placement_given_back_is_never_launched(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger, wiped: bool
) -> None:
    """The placed job that loses its GPUs to a running one gives its placement back; until that is applied its
    record still looks placed, and neither the start-up resync nor a reload may launch it onto the GPUs the running
    job is on."""
    store = await JobStore.open(bus)
    assert await store.create(_on_node("placed", "best-effort", started=None)) is not None
    assert await store.create(_on_node("runs", "best-effort", started=time.time() - 100)) is not None
    if not wiped:
        await ledger.rebuild([])  # ready, both claims lost
    s = await _scheduler(settings, bus, ledger)
    s._reload_needed = True
    await s.on_events([])
    await _drain(s)
    events = await bus.read_since(JOBS, bus.names.job_lifecycle("placed"), 0.0, Decoder(JobEvent))
    assert [type(e) for e in events] == [JobLaunchFailed], "given back, and not launched"
    assert "placed" not in {r.id for r in s._relaunches()}
    await s.close()


def _refuse_give_backs(bus: Bus, times: int) -> None:
    """The bus refuses the next `times` JobLaunchFailed publishes (a NATS blip)."""
    real = bus.publish
    left = [times]

    async def publish(subject: str, event: Any, **kwargs: Any) -> Any:
        if isinstance(event, JobLaunchFailed) and left[0] > 0:
            left[0] -= 1
            raise BusError("NATS away (injected)")
        return await real(subject, event, **kwargs)

    bus.publish = publish  # type: ignore[method-assign]


@pytest.mark.parametrize("path", ["start", "reload"])
async def test_a_placement_given_back_while_the_bus_refused_is_never_launched(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger, path: str
) -> None:
    """Found by review: the ledger gives node-a to a running job, and a record places another job there that never
    started (a deposed leader's late write). Its give-back is refused by the bus once: it used to be left to the
    launch deadline, and the start-up resync (or the next reload) launched it onto node-a, beside the running job.
    It is given back at once all the same, never launched, and its JobLaunchFailed published at the next pass."""
    store = await JobStore.open(bus)
    assert await store.create(_on_node("runs", "best-effort", started=time.time() - 100)) is not None
    await ledger.rebuild([])
    await ledger.claim_many([Claim("runs", 1, tuple(f"node-a/{i}" for i in range(8)))])
    ctx = make_context(settings, "scheduler")
    executor = SimulatedExecutor(bus, ctx.clock)
    launched: list[str] = []
    real_launch = executor.launch

    async def launch(record: JobRecord) -> None:
        launched.append(record.id)
        await real_launch(record)

    executor.launch = launch  # type: ignore[method-assign]
    s = Scheduler(ctx, bus, ledger, store, executor, quota_store=await QuotaStore.open(bus))
    if path == "start":
        assert await store.create(_on_node("placed", "best-effort", started=None)) is not None
        _refuse_give_backs(bus, 1)
        await s.start()
        assert s.consumer is not None
        await s.consumer.stop()
    else:
        await s.start()
        assert s.consumer is not None
        await s.consumer.stop()
        assert await store.create(_on_node("placed", "best-effort", started=None)) is not None
        _refuse_give_backs(bus, 1)
        s._reload_needed = True
        await s.on_events([])
    await _run_for(s, 1.0)
    await _drain(s)
    events = await bus.read_since(JOBS, bus.names.job_lifecycle("placed"), 0.0, Decoder(JobEvent))
    assert "placed" not in launched
    assert [type(e) for e in events] == [JobLaunchFailed], "given back (published at a later pass), never launched"
    assert set((await ledger.snapshot()).claims) == {"runs"}
    await s.close()


async def test_a_lost_claim_on_a_gpu_cordoned_since_is_made_again_and_the_cordon_stops_the_job(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """Redis lost a running job's claim, and one of its GPUs was cordoned since (a fatal fault): the claim is made
    again all the same (the job is on those GPUs whatever the cordon says), so the ledger and the scheduler agree,
    and the cordon's rule interrupts the job. The restore used to be refused: the ledger check then found the two
    out of step and reloaded everything every 10 s until the job stopped. A placement that had not started on a
    cordoned GPU is not launched there: it gives the placement back and waits again."""
    store = await JobStore.open(bus)
    assert await store.create(_on_node("runs", "train", started=time.time() - 100)) is not None
    assert await store.create(_on_node("placed", "train", started=None, node="node-b")) is not None
    await ledger.rebuild([])
    await ledger.cordon(["node-a/3", "node-b/5"], Cordon(severity="fatal", reason="health: DBE"))
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([])
    assert set((await ledger.snapshot()).claims) == {"runs"}
    failed = await bus.read_since(JOBS, bus.names.job_lifecycle("placed"), 0.0, Decoder(JobEvent))
    assert [e.reason for e in failed if isinstance(e, JobLaunchFailed)] == [
        "GPU node-b/5 became unschedulable (fatal: health: DBE) before it started"
    ]
    await s.on_events(failed)  # (as its consumer would hand it over: the job waits again)
    placed = await _record(s, "placed")
    assert placed is not None
    assert placed.state == JobState.PENDING
    assert placed.placement is None or not holds_gpus(placed)
    runs = await _record(s, "runs")
    assert runs is not None
    assert runs.stopping
    assert runs.stop_kind == "interrupt"
    loads: list[int] = []
    real_load = s._load

    async def counted(records: Sequence[JobRecord], predictor: Any = None) -> None:
        loads.append(len(records))
        await real_load(records, predictor)

    s._load = counted  # type: ignore[method-assign]
    await s._check_ledger()
    assert loads == [], "the ledger and the scheduler agree: nothing to reload"
    await s.close()


async def test_a_cordon_placed_while_claims_are_restored_keeps_an_unstarted_placement_off_the_gpu(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """The GPU is cordoned after start-up read the ledger and before the lost claim of a placement that never
    started is made again: the claim is made where the cordon is checked (the ledger's script, atomically), so
    the placement is given back and never launched onto the GPU (restored without that check, it was launched,
    then interrupted)."""
    store = await JobStore.open(bus)
    assert await store.create(_on_node("placed", "train", started=None, node="node-b")) is not None
    await ledger.rebuild([])
    real_claim_many = ledger.claim_many

    async def cordoned_meanwhile(claims: Sequence[Claim], *, restore: bool = False) -> Any:
        if restore:  # the first claim call of the start-up: health cordons node-b/5 just before it
            await ledger.cordon(["node-b/5"], Cordon(severity="fatal", reason="health: DBE"))
        return await real_claim_many(claims, restore=restore)

    ledger.claim_many = cordoned_meanwhile  # type: ignore[method-assign]
    s = await _scheduler(settings, bus, ledger)
    await s.on_events([])
    await _drain(s)
    events = await bus.read_since(JOBS, bus.names.job_lifecycle("placed"), 0.0, Decoder(JobEvent))
    assert "placed" not in (await ledger.snapshot()).claims
    assert [type(e) for e in events] == [JobLaunchFailed], "given back, never launched (nor stopped)"
    await s.close()


async def test_a_job_placed_in_the_pass_of_its_submission_is_written_once(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """A job new in a pass is written once, as the pass leaves it (its first version, no state before it): placed
    at once, its `queued` state is not stored before it; one that waits is stored as queued; later changes are each
    a version, with the state they left (the bucket's history is the log of a job's changes)."""
    s = await _scheduler(settings, bus, ledger)
    cancel = JobCancelRequested(job_id="c", requested_at=time.time())
    await s.on_events([_submit("a"), _submit("b"), _submit("x"), _submit("c"), cancel])  # two nodes of 8 GPUs
    await s.on_events([JobStarted(job_id="a", attempt=1, started_at=time.time())])

    async def changes(job: str) -> list[tuple[str, str, bool]]:
        versions = await s.store.history(job)
        before = ["", *(r.state.value for r in versions)]
        return [(before[i], r.state.value, r.placement is not None) for i, r in enumerate(versions)]

    assert await changes("a") == [("", "pending", True), ("pending", "running", True)]
    assert await changes("b") == [("", "pending", True)]
    assert await changes("x") == [("", "pending", False)]
    assert await changes("c") == [("", "cancelled", False)]
    await s.close()


async def test_the_runtime_predictor_survives_a_ledger_rebuilt_from_memory(
    settings: Settings, bus: Bus, fleet: None, ledger: Ledger
) -> None:
    """When the safety net finds the ledger empty, the state is rebuilt from the records in memory, which are only
    the active ones: the runtimes learned from finished jobs used to be lost with it (relearned from no record)."""
    s = await _scheduler(settings, bus, ledger)
    for _ in range(5):
        s.control.state.predictor.observe("t", "train", 8, 600.0)
    assert s.control.state.predictor.predict("t", "train", 8) == 600.0
    await _wipe(ledger)
    await s._check_ledger()
    assert s.control.state.predictor.predict("t", "train", 8) == 600.0
    await s.close()
