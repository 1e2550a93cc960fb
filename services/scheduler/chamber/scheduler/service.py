"""The scheduler shell: one long-lived decision state, moved by events, applied in batches, fenced.

- **One state.** The `Controller` (job records + scheduling state) is loaded once at start-up and then moved
  by events: a submission is queued, a finish frees GPUs, a stop requeues. It is rebuilt only after the ledger
  was lost or found out of step with it.
- **Event-driven.** Each batch of job events the consumer fetches is applied and decided at once: an arrival
  is placed when it arrives, a freed GPU is reused at once. A full cycle runs when something invalidated the last
  one, and at least every `schedule_interval_s` as a safety net (minimum runtimes pass, estimates run out).
- **Batched, pipelined apply.** All placements of a pass are claimed in one Lua call (each job all or nothing),
  records are written and decisions published with async publishes and one wait for all acks, and the executor
  is called after the lock is released.
- **Fenced.** Only the holder of the scheduler lease acts; a second process waits as standby, following the job
  records so that taking over does not read the whole bucket (`standby.py`). The lease's
  fencing token travels with every ledger write, so a leader paused past its lease cannot claim.

Crash safety (docs/architecture.md has the full argument): an event is acked only after its effect is in the KV
and the ledger; a placement is claimed before the record says so; claims no record explains are released at
start-up; the ledger is rebuilt from the records whenever it is found empty.
"""

import asyncio
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chamber.common.bus import Bus, BusError, Consumer
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import (
    TERMINAL_STATES,
    Cordon,
    Decision,
    JobEvent,
    JobLaunchFailed,
    JobPlaced,
    JobRecord,
    JobState,
    JobStateChanged,
    JobSubmitted,
    Node,
    NodeInventory,
    QuotaConfig,
    QuotaState,
    SchedulerStats,
)
from chamber.common.jobstore import JobStore, StaleWrite, Write
from chamber.common.lease import Lease, LeaseLost, identity
from chamber.common.ledger import Claim, ClaimResult, Ledger, LedgerFenced, LedgerNotReady, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.quota import QuotaBook
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import DECISIONS, INVENTORY, JOBS, QUOTA
from chamber.scheduler.core import build
from chamber.scheduler.core.controller import Controller
from chamber.scheduler.core.decisions import Place, Preempt
from chamber.scheduler.core.estimates import RuntimePredictor
from chamber.scheduler.core.lifecycle import holds_gpus
from chamber.scheduler.core.state import SchedulerConfig
from chamber.scheduler.executor import Executor, make_executor
from chamber.scheduler.standby import RecordView

log = get_logger(__name__)
_decisions = Decoder(Decision)

REPUBLISH_SLACK_S = 5.0
"""At start, records changed up to this long before the last published decision are published again (clocks of
two scheduler hosts may disagree a little)."""
CHECK_LEDGER_S = 10.0
"""How often the leader compares the ledger's owners with its own state (a safety net; they agree by design)."""
STATS_S = 1.0


@dataclass
class _Pending:
    """What one pass has to write, release, claim, publish and hand to the executor."""

    writes: dict[str, JobRecord] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)
    """Jobs whose record does not exist in the store yet (written with create, not update)."""
    releases: list[tuple[str, int]] = field(default_factory=list)
    placed: list[Place] = field(default_factory=list)
    conflicts: set[str] = field(default_factory=set)
    placing: dict[str, JobRecord] = field(default_factory=dict)
    """Placed records not written yet: launched only once they are (a launch never runs ahead of its record)."""
    launches: list[JobRecord] = field(default_factory=list)
    stops: list[tuple[JobRecord, str, float]] = field(default_factory=list)
    resync: list[JobRecord] = field(default_factory=list)
    """Records another writer started or is stopping: the executor takes them on (`Executor.resync`)."""
    confirmed: bool = False
    """`_confirm` found this leader holding the fence over a whole ledger: only then is anything executed."""

    def write(self, record: JobRecord) -> None:
        """The record is written once per pass, as the pass leaves it: each write is a version the jobs KV bucket
        keeps, and that history is the log of the job's changes (a job started and finished in one batch of events
        is one version)."""
        self.writes[record.id] = record


class Scheduler:
    def __init__(
        self,
        ctx: Context,
        bus: Bus,
        ledger: Ledger,
        store: JobStore,
        executor: Executor,
        *,
        quota_store: QuotaStore,
        holder: str = "",
        confirm_lead: Callable[[], Awaitable[None]] | None = None,
        lead_fresh: Callable[[], bool] | None = None,
        view: RecordView | None = None,
    ) -> None:
        """`confirm_lead` raises `LeaseLost` unless this process still leads (the lease's renewal): asked right
        before the ledger is rebuilt, the one write a lost fence cannot refuse."""
        self.ctx = ctx
        self.bus = bus
        self.ledger = ledger
        self.store = store
        self.executor = executor
        self.quota_store = quota_store
        self.holder = holder
        self.confirm_lead = confirm_lead
        self.lead_fresh = lead_fresh
        """False when this leader's lease was not confirmed lately (it was paused, or NATS was away): before it acks
        events it then proves it still leads (a deposed leader used to ack, as no-ops, events about jobs it never
        heard of, and they were lost to the new leader)."""
        self.view = view
        """The records as this process followed them while it waited as standby: read at start instead of the
        whole bucket (`standby.py`), then stopped."""
        self.names = bus.names
        settings = ctx.settings
        self.control = Controller(
            SchedulerConfig(
                order=settings.scheduler_order,
                max_wait_s=settings.scheduler_max_wait_s or None,
                consolidate=settings.scheduler_consolidate,
                reclaim_past_guarantee=settings.scheduler_reclaim_past_guarantee,
            )
        )
        self.revisions: dict[str, int] = {}
        """KV revision of every active record."""
        self.nodes: dict[str, Node] = {}
        self.quota_config = QuotaConfig()
        self.quota_state: QuotaState | None = None
        self.starting: dict[str, tuple[int, float]] = {}
        """Placed jobs not yet started: job -> (attempt, placed at), for the launch deadline."""
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._cordons_dirty = False
        self._quota_dirty = False
        self._last_cycle = 0.0
        self._last_check = 0.0
        self._executing: set[asyncio.Task[None]] = set()
        self._stop_quota: Callable[[], Awaitable[None]] | None = None
        self._decide_ms: list[float] = []
        self._apply_ms: list[float] = []
        self._placed = 0
        self._reload_needed = False
        self._relaunch: dict[str, int] = {}
        """job -> attempt whose launch failed (the executor raised: NATS or the API away) or never ran (the batch
        that placed it failed after storing it): launched again at the next passes until it goes through."""
        self._restop: list[tuple[JobRecord, str, float]] = []
        """Stops of a pass that failed before it was confirmed: executed at the next confirmed pass."""
        self._resync: list[JobRecord] = []
        """Likewise, records for the executor to take on."""
        self._unbacked: dict[str, tuple[int, str]] = {}
        """job -> (attempt, why): running, but its claim could not be made again because the ledger gives its GPUs
        to another job; it is interrupted at the next pass, so that no GPU runs two jobs."""
        self._given_back: dict[str, int] = {}
        """job -> the attempt whose placement `_placement_lost` gave back (until its JobLaunchFailed is applied):
        never launched, its GPUs are another job's."""
        self._giving_back: dict[str, JobLaunchFailed] = {}
        """Give-backs (`_placement_lost`) the bus did not take yet: published again at every pass."""
        self.fenced = asyncio.Event()
        """Set when this leader found itself deposed (fence or lease): a newer leader acts now, this one stops."""
        self.consumer: Consumer[Any] | None = None

    # ---- start-up ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        started = time.perf_counter()
        if self.ledger.token:
            await self.ledger.take_fence()  # from now on a paused former leader cannot claim or release
        records, predictor, since = await self._first_read()
        await self._republish_unannounced(records, since)
        for inv in await self.bus.read_latest(INVENTORY, self.names.subject("inventory.>"), Decoder(NodeInventory)):
            self.nodes[inv.node.name] = inv.node
        self.quota_config, _ = await self.quota_store.get()
        latest = await self.bus.read_latest(QUOTA, self.names.quota_state(), Decoder(QuotaState))
        self.quota_state = latest[-1] if latest else None
        async with self._lock:
            await self._reconcile_ledger({r.id: r for r in records})
            await self._load(records, predictor)
        held = [r for r in self.control.records.values() if holds_gpus(r) and not self._lost(r)]
        await self.executor.resync(held)
        for record in held:
            if record.state != JobState.RUNNING:
                self.starting[record.id] = (record.attempt, self.ctx.clock.now())
        await self.bus.watch_latest(self.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        await self.bus.watch_latest(self.names.quota_state(), Decoder(QuotaState), self._on_quota)
        self._stop_quota = await self.quota_store.follow(self._on_quota_config)
        await self.bus.nc.subscribe(self.names.subject("health.verdicts.>"), cb=self._on_verdict)
        consumer = self.consumer = self.bus.consumer(
            stream=JOBS,
            durable="scheduler",
            filter_subjects=[self.names.subject("jobs.>")],
            decoder=Decoder(JobEvent),
            handler=self.on_event,
            batch_handler=self.on_events,
            recheck_handler=self.on_events_again,
            batch=256,
            outage=(LedgerUnavailable, LedgerFenced, LeaseLost),
        )
        await consumer.start()
        log.info(
            "scheduler.started", holder=self.holder, token=self.ledger.token, active=len(self.control.records),
            nodes=len(self.nodes), took_ms=round((time.perf_counter() - started) * 1000, 1), core=build(),
        )  # fmt: skip

    async def _first_read(self) -> tuple[list[JobRecord], RuntimePredictor | None, float]:
        """The records to start from, a predictor already learned from them (None: relearn), and the time since
        which their placements may be unannounced (`_unannounced_since`). From the view a standby kept, once it has
        taken in every write up to now (after the fence: nobody else writes): it holds every active record, and only
        those hold placements to publish again (`_republish_unannounced`); else, as a cold start, the whole
        bucket."""
        view, self.view = self.view, None
        if view is not None:
            try:
                await view.caught_up()
                stored = view.records()
                since = await self._unannounced_since()
                self.revisions = {job_id: rev for job_id, (r, rev) in stored.items() if r.state not in TERMINAL_STATES}
                log.info("scheduler.records_from_standby", active=len(view.active), ended=len(view.ended))
                return [record for record, _ in stored.values()], view.predictor, since
            except BusError as exc:
                log.warning("scheduler.standby_view_failed", error=str(exc))
            finally:
                await view.stop()
        records = await self._read_records()
        return records, None, await self._unannounced_since()

    async def _unannounced_since(self) -> float:
        """Records changed at or after this time may hold placements nobody heard of: those since the last decision
        on the bus (less a slack for clocks). (A `JobStateChanged` is the last decision of a stream written before
        the record's history became the log of its changes.)"""
        last = await self.bus.last_message_of(DECISIONS)
        if last is None:
            return 0.0
        try:
            decision = _decisions.decode(last)
        except DecodeError:
            return 0.0
        return (decision.at if isinstance(decision, JobStateChanged) else decision.decided_at) - REPUBLISH_SLACK_S

    async def _republish_unannounced(self, records: Sequence[JobRecord], since: float | None = None) -> None:
        """A leader that died between writing records and publishing their placements left placements nobody heard
        of: publish again the placement of every record that holds GPUs and changed since the last decision on the
        bus (`since`, read now unless given; message ids drop the ones that were published after all; consumers
        keep the first of an attempt). Their changes need no announcing: the record's history is their log."""
        if since is None:
            since = await self._unannounced_since()
        todo = _Pending()
        for record in records:
            if record.updated_at >= since and holds_gpus(record) and record.placement is not None:
                p = record.placement
                todo.placed.append(Place(record.id, p.attempt, tuple(p.gpus), p.reason))
        if todo.placed:
            log.info("scheduler.republish", placements=len(todo.placed), since=since)
            await self._publish(todo)

    async def _read_records(self) -> list[JobRecord]:
        """Every record from the store; the revisions of the active ones are kept for compare-and-set writes."""
        stored = await self.store.load_all()
        self.revisions = {job_id: rev for job_id, (r, rev) in stored.items() if r.state not in TERMINAL_STATES}
        return [record for record, _ in stored.values()]

    async def _reload(self) -> None:
        """Start over from the store and the ledger, after a pass failed part way (a write or a claim whose outcome
        is unknown, a publish that did not get through) and left memory ahead of them. Placements the store has but
        the bus may not have heard of are published again, as at start-up."""
        log.warning("scheduler.reload")
        await self.ledger.is_ready()  # fails fast while Redis is away, before reading every record
        records = await self._read_records()
        await self._reconcile_ledger({r.id: r for r in records})
        await self._load(records)
        await self._republish_unannounced(records)
        self._reload_needed = False
        for record in self.control.records.values():  # the failed batch may have placed some and launched none
            if _awaits_start(record) and not self._lost(record):
                self._relaunch[record.id] = record.attempt

    async def _load(self, records: Sequence[JobRecord], predictor: RuntimePredictor | None = None) -> None:
        """Build the decision state from scratch from the records, the inventory, the ledger and the quota (and the
        runtime predictor: relearned from `records` unless given)."""
        snap = await self.ledger.snapshot()
        if not snap.ready:
            await self._rebuild_ledger(records)
            snap = await self.ledger.snapshot()
        book, standing, blocks = self._quota_inputs()
        self.control.load(
            self.nodes.values(), records, snap.owners, snap.cordons, quota=book, standing=standing,
            budget_blocks=blocks, predictor=predictor,
        )  # fmt: skip
        for record in records:
            if self._lost(record):  # given back, its JobLaunchFailed on its way: nothing is to stop or preempt
                self.control.state.mark_stopping(record.id)
        self._wake.set()

    # ---- inputs --------------------------------------------------------------------------------------------------

    async def on_event(self, event: Any) -> None:
        await self.on_events([event])

    async def on_events_again(self, events: list[Any]) -> None:
        """Events that may have been handled before: replayed after a crash, or redelivered. Memory holds only
        active jobs, so a submission of a job it does not know may be one that already ran and ended: it is looked
        up in the store first, never placed a second time."""
        await self.on_events(events, recheck=True)

    async def on_events(self, events: list[Any], *, recheck: bool = False) -> None:
        """A batch of job events: through the state machine, persisted, then decided on at once. Raises (so the
        events are redelivered) when a step failed; memory is then brought back to the store and the ledger before
        the next batch (`_reload`).

        Round trips per batch: the records the events changed are written (before their GPUs are released, so a
        crash never leaves a released claim under a record that still holds it); the releases and this pass's
        claims go to the ledger in one transaction; the new and decided records are written (a job submitted
        and placed in one pass is written once); the placements are published."""
        todo = _Pending()
        try:
            async with self._lock:
                if self._reload_needed:
                    await self._reload()
                try:
                    await self._apply_events(events, todo, recheck=recheck)
                except (LedgerFenced, LeaseLost):
                    self._reload_needed = True
                    self._deposed()
                    raise
                except BaseException:
                    self._reload_needed = True  # memory may be ahead of the store or the ledger: start over
                    raise
        finally:
            self._execute(todo)  # what was claimed and written is launched even if a later step failed
        if todo.conflicts:
            raise StaleWrite(f"job records changed by another writer: {', '.join(sorted(todo.conflicts)[:5])}")

    async def _apply_events(self, events: list[Any], todo: _Pending, *, recheck: bool) -> None:
        """Under the lock: the events through the state machine, their records written, then one pass."""
        if recheck:
            events = await self._unhandled(events, todo)
        self._sync_quota()  # a budget or quota change that came in since: arrivals are decided under it
        now = self.ctx.clock.now()
        for event in events:
            self._apply_event(event, now, todo)
        await self._persist(todo, defer=todo.created)
        await self._pass(now, todo)
        if self.ledger.token and self.lead_fresh is not None and not self.lead_fresh():
            await self._prove_lead()  # the events are acked next

    async def _unhandled(self, events: list[Any], todo: _Pending) -> list[Any]:
        """`events` without the submissions of jobs the store already has (one concurrent read per job that memory
        does not know). A stored record that is still active but missing from memory is taken from the store."""
        unknown = sorted({e.job_id for e in events if isinstance(e, JobSubmitted) and self.control.submitted(e)})
        if not unknown:
            return events
        found = await asyncio.gather(*(self.store.get(job_id) for job_id in unknown))
        stored: set[str] = set()
        adopted: list[JobRecord] = []
        for job_id, entry in zip(unknown, found, strict=True):
            if entry is None:
                continue
            stored.add(job_id)
            record, revision = entry
            if record.state not in TERMINAL_STATES:
                log.warning("scheduler.adopt_stored", job_id=job_id, state=record.state.value)
                self.control.replace(record)
                self.revisions[job_id] = revision
                adopted.append(record)
                if holds_gpus(record) and not _awaits_start(record):
                    todo.resync.append(record)
        await self._verify(adopted, todo)
        return [e for e in events if not (isinstance(e, JobSubmitted) and e.job_id in stored)]

    def _apply_event(self, event: JobEvent, now: float, todo: _Pending) -> None:
        transition = self.control.apply(event, now)
        if transition is None:
            return
        record = transition.record
        if transition.previous is None:
            todo.created.add(record.id)
        todo.write(record)
        if transition.release_attempt is not None:
            todo.releases.append((record.id, transition.release_attempt))
            self.starting.pop(record.id, None)
        if transition.stop_attempt is not None:
            todo.stops.append((record, "cancelled", 0.0))
        if record.state == JobState.RUNNING:
            self.starting.pop(record.id, None)

    def _on_inventory(self, inv: NodeInventory) -> None:
        known = self.nodes.get(inv.node.name)
        if known == inv.node:
            return
        self.nodes[inv.node.name] = inv.node
        if known is None and inv.node.name not in self.control.state.index.nodes:
            node, held = inv.node, self.control.state.held_slots()
            indices = [g.index for g in node.gpus]
            self.control.state.index.add_node(
                node.name, pool=node.pool, model=node.gpus[0].model if node.gpus else "", rack=node.topology.rack,
                zone=node.topology.zone, capacity=len(indices),
                free=[i for i in indices if f"{node.name}/{i}" not in held],
            )  # fmt: skip
            self._quota_dirty = True
        else:
            self._check_now()  # a node changed shape: rebuild the state from a fresh snapshot
        self._wake.set()

    def _on_quota(self, state: QuotaState) -> None:
        self.quota_state = state
        self._quota_dirty = True
        self._wake.set()

    def _on_quota_config(self, config: QuotaConfig) -> None:
        self.quota_config = config
        self._quota_dirty = True
        self._wake.set()

    async def _on_verdict(self, msg: Any) -> None:
        """Health decided something: re-read the cordons now rather than at the next cycle."""
        self._cordons_dirty = True
        self._wake.set()

    def _sync_quota(self) -> None:
        if self._quota_dirty:
            self._quota_dirty = False
            self.control.state.set_quota(*self._quota_inputs())

    def _check_now(self) -> None:
        self._last_check = 0.0

    def _quota_inputs(self) -> tuple[QuotaBook | None, dict[str, float], dict[str, str]]:
        """The quota book (configuration + capacity from the inventory), standings and budget blocks."""
        if not self.quota_config.teams:
            return None, {}, {}
        capacity: dict[str, int] = {}
        for node in self.nodes.values():
            capacity[node.pool] = capacity.get(node.pool, 0) + len(node.gpus)
        book = QuotaBook(self.quota_config, capacity)
        standing: dict[str, float] = {}
        blocks: dict[str, str] = {}
        if self.quota_state is not None:
            for team, usage in self.quota_state.teams.items():
                standing[team] = usage.standing
                if usage.budget_state == "blocked-all":
                    blocks[team] = "block-all"
                elif usage.budget_state == "blocked-preemptible":
                    blocks[team] = "block-preemptible"
        return book, standing, blocks

    # ---- the loop: safety-net cycles and everything that is not a job event --------------------------------

    async def run(self, stop: asyncio.Event, lost: asyncio.Event | None = None) -> None:
        interval = self.ctx.settings.schedule_interval_s
        next_stats = 0.0
        lost = lost or asyncio.Event()
        while not stop.is_set() and not lost.is_set() and not self.fenced.is_set():
            await wait_event(self._wake, min(interval, STATS_S))
            self._wake.clear()
            if stop.is_set() or lost.is_set() or self.fenced.is_set():
                break
            todo = _Pending()
            try:
                async with self._lock:
                    if self._reload_needed:
                        await self._reload()
                    now = self.ctx.clock.now()
                    if self._cordons_dirty:
                        self._cordons_dirty = False
                        self._sync_cordons(await self.ledger.cordons())
                    self._sync_quota()
                    if now - self._last_check >= CHECK_LEDGER_S:
                        self._last_check = now
                        await self._check_ledger()
                    full = now - self._last_cycle >= interval
                    await self._pass(now, todo, full=full)
                    await self._launch_deadlines(now)
                    if self._giving_back:
                        await self._prove_lead()  # (as for a deadline: a deposed leader's must not undo a launch)
                        await self._give_back()
                    again = self._relaunches()
                    if again or self._restop or self._resync:
                        todo.launches.extend(again)
                        todo.stops.extend(self._restop)
                        todo.resync.extend(self._resync)
                        self._restop, self._resync = [], []
                        todo.confirmed = False
                        await self._confirm(todo)
            except (LedgerFenced, LeaseLost):
                self._deposed()
                raise
            except Exception:
                log.exception("scheduler.pass_failed")
                self._reload_needed = True  # memory may be ahead of the store or the ledger: start over
                self._execute(todo)
                await asyncio.sleep(0.5)
                continue
            self._execute(todo)
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + STATS_S
                await self._publish_stats()

    def _sync_cordons(self, cordons: dict[str, Cordon]) -> None:
        state = self.control.state
        for slot in [s for s in state.cordoned if s not in cordons]:
            state.uncordon(slot)
        for slot, cordon in cordons.items():
            state.cordon(slot, cordon)

    # ---- deciding and applying -------------------------------------------------------------------------------

    async def _pass(self, now: float, todo: _Pending, *, full: bool = False) -> None:
        """Decide and apply: release what ended and claim what was placed, write the records, publish the changes
        (the executor is called by the caller, outside the lock)."""
        if full:
            self.control.state.invalidate()
        cycle = self.control.state.ctx is None
        t0 = time.perf_counter()
        unbacked = self._interrupt_unbacked() if self._unbacked else []  # first: no cycle may take them as victims
        decisions = [*unbacked, *self.control.decide(now)]
        t1 = time.perf_counter()
        if cycle:
            self._last_cycle = now
        if decisions:
            self._decide_ms.append((t1 - t0) * 1000)
        releases = [(job, attempt) for job, attempt in todo.releases if job not in todo.conflicts]
        places = [d for d in decisions if isinstance(d, Place)]
        if not places and not releases and any(isinstance(d, Preempt) for d in decisions):
            await self._prove_lead()  # a deposed leader writes no preemption of its own
        refused = await self._claim(places, releases)
        for decision in decisions:
            if isinstance(decision, Place) and decision.job_id in refused:
                continue
            changed = self.control.commit(decision, now)
            if changed is None:
                continue
            todo.write(changed)
            if isinstance(decision, Place):
                todo.placed.append(decision)
                todo.placing[decision.job_id] = changed
                self.starting[decision.job_id] = (decision.attempt, now)
            elif isinstance(decision, Preempt):
                todo.stops.append((changed, decision.reason, decision.grace_s))
        await self._persist(todo)
        await self._confirm(todo)
        await self._publish(todo)
        if decisions:
            self._apply_ms.append((time.perf_counter() - t1) * 1000)
        if refused:
            self._wake.set()  # the fleet moved under this pass: decide again with what we learned

    def _interrupt_unbacked(self) -> list[Preempt]:
        """Stop the running jobs whose GPUs the ledger gives another job (`_unbacked`): the ledger is the truth
        about who holds a GPU, so the job it does not back goes back to the queue (an interruption: it resumes from
        its checkpoint), instead of sharing its GPUs with the one it backs."""
        stops: list[Preempt] = []
        for job_id, (attempt, holder) in self._unbacked.items():
            record = self.control.records.get(job_id)
            if record is None or record.attempt != attempt or not holds_gpus(record) or record.stopping:
                continue
            self.control.state.mark_stopping(job_id)
            why = f"interrupted: its GPUs were claimed by another job ({holder}); stopped so no GPU runs two jobs"
            stops.append(Preempt(job_id, attempt, 0.0, why, interrupt=True))
        self._unbacked.clear()
        if stops:
            self.control.state.invalidate()  # what a kept cycle context counted as running is stopping now
        return stops

    async def _claim(self, places: list[Place], releases: list[tuple[str, int]]) -> set[str]:
        """Release ended attempts and claim every placement in one round trip; returns the jobs whose claim was
        refused (already undone in the state)."""
        claims = [Claim(p.job_id, p.attempt, tuple(g.slot for g in p.gpus)) for p in places]
        if not claims and not releases:
            return set()
        try:
            results = await self.ledger.release_and_claim(releases, claims)
        except LedgerNotReady:
            log.warning("scheduler.ledger_lost")
            await self._rebuild_ledger(list(self.control.records.values()))  # the records hold the releases
            results = await self.ledger.claim_many(claims)
        refused: set[str] = set()
        for place, result in zip(places, results, strict=True):
            if result.ok:
                continue
            log.warning("scheduler.claim_refused", job_id=place.job_id, code=result.code, detail=result.detail)
            refused.add(place.job_id)
            self.control.refuse(place)
            if result.code == "UNSCHEDULABLE":
                self._cordons_dirty = True
            else:
                self._check_now()  # the ledger and our state disagree: compare them at the next pass
        self._placed += len(places) - len(refused)
        return refused

    async def _prove_lead(self) -> None:
        """Still the leader? The lease's renewal (a compare-and-set in NATS) answers even when Redis lost the fence
        with everything else; then the fence, over a whole ledger (`Ledger.confirm`)."""
        if not self.ledger.token:
            return
        if self.confirm_lead is not None:
            try:
                await self.confirm_lead()
            except LeaseLost:
                self._deposed()
                raise
        await self.ledger.confirm()

    def _deposed(self) -> None:
        self.fenced.set()  # the loop ends, and with it this leader (a newer one acts)
        self._wake.set()

    async def _confirm(self, todo: _Pending) -> None:
        """After the pass's records are written and before anything is published, launched or stopped: does this
        leader still hold the fence, over a whole ledger (one small round trip)? A leader paused past its lease
        between its claim and its write is refused here and acts on nothing it wrote: the new leader took the fence
        before reading the records, so a claim it released as an orphan is never launched on (its record, placed
        without a claim, is checked by the new leader when it comes across it: see `_verify`). Holding the fence, no
        one else released this pass's claims: only a newer leader, or a wipe (the ledger then not whole), could."""
        if not self.ledger.token or not (todo.launches or todo.stops or todo.resync):
            todo.confirmed = True
            return
        try:
            await self.ledger.confirm()
        except LedgerFenced:
            log.error("scheduler.deposed_mid_pass", launches=len(todo.launches), stops=len(todo.stops))
            todo.launches, todo.stops, todo.placed = [], [], []
            self._deposed()
            raise
        todo.confirmed = True

    async def _persist(self, todo: _Pending, defer: set[str] | None = None) -> None:
        """Write the pass's records (one wait for all acks), except those in `defer`; they are written later.
        Writes refused as stale leave memory holding the stored record (`todo.conflicts`: their events must be
        applied again); any other failure leaves memory ahead of the store, so the next pass starts over."""
        records = [r for job, r in todo.writes.items() if not defer or job not in defer]
        if not records:
            return
        for record in records:
            del todo.writes[record.id]
        writes = [Write(r, 0 if r.id in todo.created else self.revisions[r.id]) for r in records]
        results = await self.store.write_many(writes)
        stale: list[JobRecord] = []
        failed: BusError | None = None
        for record, result in zip(records, results, strict=True):
            if isinstance(result, StaleWrite):
                stale.append(record)
            elif isinstance(result, BusError):
                failed = result
            else:
                todo.created.discard(record.id)
                if record.id in todo.placing:
                    todo.launches.append(todo.placing.pop(record.id))
                if record.state in TERMINAL_STATES:
                    self.revisions.pop(record.id, None)
                else:
                    self.revisions[record.id] = result
        if failed is not None:
            self._reload_needed = True  # memory moved on, the store did not: start over from the store
            raise failed
        if stale:
            todo.conflicts |= await self._refresh(stale, todo)

    async def _refresh(self, stale: list[JobRecord], todo: _Pending) -> set[str]:
        """Writes refused as stale: a submission that was a duplicate of a stored job (take the stored record),
        or a record that another writer changed (take the stored one; the events that caused ours are applied
        again to it when they are redelivered)."""
        conflicts: set[str] = set()
        phantoms: list[tuple[str, int]] = []
        unheld: list[tuple[str, int]] = []
        adopted: list[JobRecord] = []
        for record in stale:
            stored = await self.store.get(record.id)
            if record.id in todo.created:
                todo.created.discard(record.id)
                placed = todo.placing.pop(record.id, None)
                if placed is not None and placed.placement is not None:  # claimed in this pass: undo it
                    attempt = placed.placement.attempt
                    live = stored is not None and holds_gpus(stored[0]) and stored[0].attempt == attempt
                    if not live:  # (never release a claim the stored record stands behind)
                        phantoms.append((record.id, attempt))
                if stored is None:
                    self.control.forget(record.id)
                    continue
                if holds_gpus(stored[0]):
                    self.control.replace(stored[0])
                else:
                    self.control.adopt(stored[0])
                if stored[0].id in self.control.records:
                    self.revisions[record.id] = stored[1]
                    adopted.append(stored[0])
                continue
            conflicts.add(record.id)
            log.error("scheduler.stale_write", job_id=record.id)
            if stored is None:
                self.control.forget(record.id)
                self.revisions.pop(record.id, None)
            else:
                self.control.replace(stored[0])
                self.revisions[record.id] = stored[1]
                adopted.append(stored[0])
                unheld.extend(self._catch_up(record, stored[0], todo))
        if unheld:
            await self.ledger.release_many(unheld)
        if phantoms:
            log.warning("scheduler.duplicate_submission_unplaced", jobs=[job for job, _ in phantoms][:5])
            ids = {job for job, _ in phantoms}
            for job in ids:
                self.starting.pop(job, None)
            todo.placed = [p for p in todo.placed if p.job_id not in ids]
            await self.ledger.release_many(phantoms)
        todo.placed = [p for p in todo.placed if p.job_id not in conflicts]  # not stored: not announced
        await self._verify(adopted, todo)
        return conflicts

    def _catch_up(self, ours: JobRecord, stored: JobRecord, todo: _Pending) -> list[tuple[str, int]]:
        """A record another writer moved on: a leader deposed mid-batch writes the records of the events it applied
        and is then refused its releases, publishes, launches and stops. Whatever the stored record implies is done
        here, as if this leader had written it: the executor takes on a job it records as running or stopping (its
        end must be heard of, its stop made), and the attempts it no longer holds are returned, to be released (a
        job that ended must not keep its GPUs). (A placement is announced once its claim is confirmed: `_verify`.)"""
        if not _awaits_start(stored) and holds_gpus(stored):
            todo.resync.append(stored)  # it runs (or stops) under a launch or stop this leader did not make
        held = stored.attempt if holds_gpus(stored) else None
        return [(stored.id, attempt) for attempt in {ours.attempt, stored.attempt} if attempt != held]

    async def _verify(self, records: Sequence[JobRecord], todo: _Pending) -> None:
        """Records taken from the store that another writer placed (a deposed leader, paused between its claim and
        its write, whose claim this leader may have released as an orphan, and whose GPUs it may have given to
        another job): their claims are made again. Standing, or free to be made, the placement is announced and
        launched (launches are idempotent) under a launch deadline; taken, the job gives it back and waits again."""
        placed = [(r, r.placement) for r in records if _awaits_start(r) and r.placement is not None]
        if not placed:
            return
        claims = [Claim(r.id, r.attempt, tuple(g.slot for g in p.gpus)) for r, p in placed]
        for (record, placement), result in zip(placed, await self.ledger.claim_many(claims), strict=True):
            if result.ok:
                todo.placed.append(Place(record.id, record.attempt, tuple(placement.gpus), placement.reason))
                self._relaunch[record.id] = record.attempt
                if self.starting.get(record.id, (None, 0.0))[0] != record.attempt:
                    self.starting[record.id] = (record.attempt, self.ctx.clock.now())
            else:
                log.error("scheduler.adopted_placement_taken", job_id=record.id, code=result.code)
                await self._placement_lost(record, _why_refused(result))

    async def _publish(self, todo: _Pending) -> None:
        items: list[tuple[str, bytes, dict[str, str] | None]] = []
        now = self.ctx.clock.now()
        for p in todo.placed:  # (a placement whose record was refused as stale was taken out by `_refresh`)
            event = JobPlaced(job_id=p.job_id, attempt=p.attempt, gpus=list(p.gpus), reason=p.reason, decided_at=now)
            msg_id = _msg_id(f"{p.job_id}:{p.attempt}:placed")
            items.append((self.names.decision_placed(p.job_id), encode(event), msg_id))
        todo.placed = []
        if not items:
            return
        for attempt in range(3):  # message ids make a repeat harmless; a change nobody hears of is not
            results = await self.bus.publish_many(items)
            errors = [r for r in results if isinstance(r, BusError)]
            if not errors:
                return
            items = [item for item, r in zip(items, results, strict=True) if isinstance(r, BusError)]
            log.warning("scheduler.publish_retry", failed=len(items), error=str(errors[0]), attempt=attempt + 1)
            await asyncio.sleep(0.2 * 2**attempt)
        raise errors[0]

    async def _release(self, releases: list[tuple[str, int]]) -> None:
        if releases:
            await self.ledger.release_many(releases)

    def _execute(self, todo: _Pending) -> None:
        """Launches and stops, outside the lock and without holding up the next batch."""
        if not todo.launches and not todo.stops and not todo.resync:
            return
        if self.ledger.token and not todo.confirmed:  # the pass failed before `_confirm`: maybe deposed
            log.warning("scheduler.execution_deferred", launches=len(todo.launches), stops=len(todo.stops))
            for r in todo.launches:
                self._relaunch[r.id] = r.attempt
            self._restop.extend(todo.stops)
            self._resync.extend(todo.resync)
            todo.launches, todo.stops, todo.resync = [], [], []
            return
        calls = [self.executor.launch(r) for r in todo.launches]
        calls += [self.executor.stop(r, reason, grace) for r, reason, grace in todo.stops]
        if todo.resync:
            calls.append(self.executor.resync(todo.resync))
        task = asyncio.create_task(self._gather(calls, todo.launches))
        self._executing.add(task)
        task.add_done_callback(self._executing.discard)

    async def _gather(self, calls: Sequence[Awaitable[None]], launches: Sequence[JobRecord] = ()) -> None:
        for i, result in enumerate(await asyncio.gather(*calls, return_exceptions=True)):
            if isinstance(result, Exception):
                log.error("scheduler.executor_failed", error=repr(result))
                if i < len(launches):  # tried again (launches are idempotent) rather than left to the deadline
                    self._relaunch[launches[i].id] = launches[i].attempt

    def _relaunches(self) -> list[JobRecord]:
        """The records whose launch is to be tried again now: those still placed and not started."""
        due = [
            record for job_id, attempt in self._relaunch.items()
            if (record := self.control.records.get(job_id)) is not None and record.attempt == attempt
            and _awaits_start(record) and not self._lost(record)
        ]  # fmt: skip
        self._relaunch.clear()
        return due

    async def _launch_deadlines(self, now: float) -> None:
        """A placed job that did not start in time gives its GPUs back and waits again (through the bus, so the
        state machine applies it like any executor report)."""
        timeout = self.ctx.settings.launch_timeout_s
        late = [(job, attempt) for job, (attempt, at) in self.starting.items() if now - at > timeout]
        if late:
            await self._prove_lead()  # a deposed leader's deadline must not undo the new leader's launch
        for job_id, attempt in late:
            event = JobLaunchFailed(
                job_id=job_id, attempt=attempt, failed_at=now, reason=f"did not start within {timeout:g} s"
            )
            try:
                await self.bus.publish(
                    self.names.job_lifecycle(job_id), event, msg_id=f"{job_id}:{attempt}:launch-late"
                )
            except BusError as exc:  # kept: tried again at the next pass (the message id makes a repeat harmless)
                log.warning("scheduler.launch_deadline_unpublished", job_id=job_id, error=str(exc))
                continue
            del self.starting[job_id]

    # ---- the ledger ------------------------------------------------------------------------------------------

    async def _reconcile_ledger(self, records: Mapping[str, JobRecord]) -> None:
        """Make the ledger agree with the records (by id) after a restart: drop orphan claims, restore missing
        ones. Done before the state is built from the ledger, so the GPUs of orphans are free in it. A ledger that
        is not ready is left alone: it is rebuilt from the records when the state is built."""
        snap = await self.ledger.snapshot()
        if not snap.ready:
            return
        orphans = [
            (job_id, claim.attempt)
            for job_id, claim in snap.claims.items()
            if job_id not in records or not holds_gpus(records[job_id]) or records[job_id].attempt != claim.attempt
        ]
        if orphans:
            log.info("scheduler.release_orphan_claims", claims=len(orphans))
            await self.ledger.release_many(orphans)
        missing = [
            Claim(r.id, r.attempt, tuple(g.slot for g in r.placement.gpus))
            for r in records.values()
            if holds_gpus(r) and r.placement is not None
            and (r.id not in snap.claims or snap.claims[r.id].attempt != r.attempt)  # (that one was an orphan)
        ]  # fmt: skip
        missing.sort(key=lambda c: _claim_rank(records[c.job_id]))  # where two lost claims meet, a running job wins
        # A job that started is on its GPUs whatever a cordon placed since says: its claim is restored, and the
        # cycle's cordon rules stop it. A placement not started yet is not launched onto a cordoned GPU: it gives
        # the placement back and waits again.
        started = [c for c in missing if not _awaits_start(records[c.job_id])]
        unstarted = [c for c in missing if _awaits_start(records[c.job_id])]
        results = await self.ledger.claim_many(started, restore=True)  # (a cordon does not refuse these)
        results += await self.ledger.claim_many(unstarted)  # (a cordon refuses these, in the same atomic step)
        for result in results:
            if result.ok:
                self._relaunch[result.claim.job_id] = result.claim.attempt  # if it has not started (idempotent)
                continue
            log.error("scheduler.restore_claim_refused", job_id=result.claim.job_id, code=result.code)
            if result.code == "TAKEN":
                await self._lost_to_another(records[result.claim.job_id], result.detail)
            elif result.code == "UNSCHEDULABLE":
                await self._placement_lost(records[result.claim.job_id], _why_refused(result, snap.cordons))

    async def _lost_to_another(self, record: JobRecord, holder: str) -> None:
        """The ledger gives the GPUs this record holds to another job: a running job is interrupted at the next
        pass (`_unbacked`), a placed one gives its placement back (`_placement_lost`)."""
        if record.state == JobState.RUNNING:
            self._unbacked[record.id] = (record.attempt, holder)
        else:
            await self._placement_lost(record, f"its GPUs were claimed by another job ({holder})")

    async def _placement_lost(self, record: JobRecord, why: str) -> None:
        """A placed job whose claim is gone and cannot be made again (a deposed leader wrote the placement after
        this leader released its claim as an orphan; it never launched it; or a GPU of it was cordoned since): it
        gives the placement back and waits again, through the bus like a launch deadline. It is given back here
        and now, whether or not the bus takes the message (then published again at every pass, `_give_back`):
        left to the launch deadline when a NATS blip refused it, the placement was launched by the start-up
        resync or the next reload onto the GPUs the ledger gives another job (found by review)."""
        event = JobLaunchFailed(job_id=record.id, attempt=record.attempt, failed_at=self.ctx.clock.now(), reason=why)
        self.starting.pop(record.id, None)
        self._given_back[record.id] = record.attempt
        self.control.state.mark_stopping(record.id)  # (as in `_load`)
        self._giving_back[record.id] = event
        await self._give_back()

    async def _give_back(self) -> None:
        """Publish the give-backs the bus has not taken yet (the message id makes a repeat harmless)."""
        for job_id, event in list(self._giving_back.items()):
            try:
                await self.bus.publish(
                    self.names.job_lifecycle(job_id), event, msg_id=f"{job_id}:{event.attempt}:claim-lost"
                )
            except BusError as exc:
                log.warning("scheduler.placement_lost_unpublished", job_id=job_id, error=str(exc))
                continue
            del self._giving_back[job_id]

    def _lost(self, record: JobRecord) -> bool:
        """Is this the placement `_placement_lost` gave back? (Entries end once the record moved on.)"""
        attempt = self._given_back.get(record.id)
        if attempt is None:
            return False
        if attempt == record.attempt and holds_gpus(record):
            return True
        del self._given_back[record.id]
        return False

    async def _rebuild_ledger(self, records: Sequence[JobRecord]) -> None:
        """Replace every claim with those of the records. A Redis that lost everything lost the fence too, so a
        leader paused past its lease would not be refused here: it first proves it still leads."""
        if self.confirm_lead is not None:
            await self.confirm_lead()
        claims: list[Claim] = []
        owners: dict[str, str] = {}
        losers: list[tuple[JobRecord, str]] = []
        for r in sorted((r for r in records if holds_gpus(r) and r.placement is not None), key=_claim_rank):
            assert r.placement is not None
            slots = tuple(g.slot for g in r.placement.gpus)
            taken = next((slot for slot in slots if slot in owners), None)
            if taken is not None:  # two records on one GPU: the ledger can back only one of them
                losers.append((r, f"{taken} by {owners[taken]}"))
                continue
            owners.update(dict.fromkeys(slots, f"{r.id}/{r.attempt}"))
            claims.append(Claim(r.id, r.attempt, slots))
        version = await self.ledger.rebuild(claims)
        log.warning("scheduler.ledger_rebuilt", claims=len(claims), version=version)
        for record, holder in losers:
            log.error("scheduler.restore_claim_refused", job_id=record.id, code="TAKEN")
            await self._lost_to_another(record, holder)

    async def _check_ledger(self) -> None:
        """The safety net: if the ledger's owners differ from what the state holds, rebuild the state from it."""
        snap = await self.ledger.snapshot()
        if not snap.ready:  # (memory holds only active records: the predictor is kept, not relearned from them)
            await self._load(list(self.control.records.values()), self.control.state.predictor)
            return
        mine = set(self.control.state.holder.items())
        theirs = {(slot, owner.rsplit("/", 1)[0]) for slot, owner in snap.owners.items()}
        if mine != theirs:
            diff = sorted(mine ^ theirs)
            log.warning("scheduler.ledger_out_of_step", differences=len(diff), first=diff[:5])
            await self._reconcile_ledger(self.control.records)
            await self._load(list(self.control.records.values()), self.control.state.predictor)
        self._sync_cordons(snap.cordons)

    # ---- reporting -------------------------------------------------------------------------------------------

    async def _publish_stats(self) -> None:
        decide, apply_ = self._decide_ms, self._apply_ms
        self._decide_ms, self._apply_ms = [], []
        state = self.control.state
        stats = SchedulerStats(
            at=self.ctx.clock.now(), holder=self.holder, token=self.ledger.token, decisions=len(decide),
            decide_p50_ms=round(statistics.median(decide), 3) if decide else 0.0,
            decide_p99_ms=round(_p99(decide), 3), apply_p99_ms=round(_p99(apply_), 3), placed=self._placed,
            waiting=len(state.queue) + len(state.nominated), running=len(state.running),
            rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            quota_at=None if self.quota_state is None else self.quota_state.computed_at,
        )  # fmt: skip
        try:
            await self.bus.publish_nowait(self.names.scheduler_stats(), stats)
        except BusError as exc:
            log.warning("scheduler.stats_failed", error=str(exc))

    async def close(self) -> None:
        """Stop taking job events first: nothing is decided or claimed after the lease is given up."""
        if self.consumer is not None:
            await self.consumer.stop()
        if self._executing:
            await asyncio.gather(*self._executing, return_exceptions=True)
        if self._stop_quota is not None:
            await self._stop_quota()


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _msg_id(value: str) -> dict[str, str]:
    return {"Nats-Msg-Id": value}


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    ledger = ctx.ledger()
    holder = identity("scheduler")
    lease = await Lease.open(bus, "scheduler", holder, ctx.settings.leader_lease_s)
    executor: Executor | None = None
    scheduler: Scheduler | None = None
    keeper: asyncio.Task[None] | None = None
    lost = asyncio.Event()
    view: RecordView | None = None
    try:
        store = await JobStore.open(bus)
        if not await lease.try_acquire():  # another leads: follow the records while waiting, to take over fast
            view = await _standby_view(store)
            if not await lease.acquire(stop):
                return
        ledger.token = lease.token
        keeper = asyncio.create_task(lease.keep(lost), name="scheduler-lease")
        executor = make_executor(ctx, bus, lead_fresh=lambda: lease.fresh(lease.ttl_s / 2))
        quota_store = await QuotaStore.open(bus)
        scheduler = Scheduler(
            ctx,
            bus,
            ledger,
            store,
            executor,
            quota_store=quota_store,
            holder=holder,
            confirm_lead=lease.renew,
            lead_fresh=lambda: lease.fresh(lease.ttl_s / 2),
            view=view,
        )
        await scheduler.start()
        await scheduler.run(stop, lost)
        if lost.is_set() or scheduler.fenced.is_set():
            raise LeaseLost("the scheduler lease was lost: another scheduler leads now")
    except LedgerFenced as exc:
        raise LeaseLost(str(exc)) from exc
    finally:
        if view is not None:
            await view.stop()
        if keeper is not None:
            keeper.cancel()
        if scheduler is not None:
            await scheduler.close()
        if executor is not None:
            await executor.close()
        await lease.release()
        await bus.close()
        await ledger.close()


async def _standby_view(store: JobStore) -> RecordView | None:
    """The records, followed while this process waits as standby; None when they cannot be read now (the
    takeover then reads the bucket, as a cold start does)."""
    view = RecordView(store)
    try:
        await view.start()
    except BusError as exc:
        log.warning("scheduler.standby_view_failed", error=str(exc))
        await view.stop()
        return None
    log.info("scheduler.standby_view", active=len(view.active), ended=len(view.ended), seen=view.seen)
    return view


def _why_refused(result: ClaimResult, cordons: Mapping[str, Cordon] | None = None) -> str:
    """Why a placement's claim could not be made again, in the words its `JobLaunchFailed` gives."""
    if result.code != "UNSCHEDULABLE":
        return f"its GPUs were claimed by another job ({result.detail})"
    cordon = (cordons or {}).get(result.detail)
    what = f" ({cordon.describe()})" if cordon is not None else ""
    return f"GPU {result.detail} became unschedulable{what} before it started"


def _claim_rank(record: JobRecord) -> tuple[bool, bool, float]:
    """Who keeps GPUs that two records name: a running job before a placed one (which has lost no work), one not
    being stopped before one that is, the one running longest first."""
    return record.state != JobState.RUNNING, record.stopping, record.started_at or float("inf")


def _awaits_start(record: JobRecord) -> bool:
    """Placed, not started, not being stopped or cancelled: what a launch is for."""
    return (
        holds_gpus(record) and record.state != JobState.RUNNING and not record.stopping and not record.cancel_requested
    )
