"""The scheduler shell: load state, decide with the pure core, apply through the ledger (guarded), publish.

Crash safety, step by step (docs/architecture.md has the full argument):
- an event is acked only after its effect is in the ledger and the jobs KV, so a crash redelivers it, and the
  state machine ignores what was already applied;
- a placement is claimed in the ledger before the record says so; a claim without a record (crash in between)
  is released at start-up;
- the ledger is rebuilt from the records whenever it is found empty (Redis restarted or flushed).
"""

import asyncio
from collections.abc import Callable
from typing import Any

from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    TERMINAL_STATES,
    JobEvent,
    JobPlaced,
    JobRecord,
    JobState,
    JobStateChanged,
    Node,
    NodeInventory,
    Placement,
    QuotaConfig,
    QuotaState,
)
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Claim, Ledger, LedgerConflict, LedgerNotReady
from chamber.common.log import get_logger
from chamber.common.quota import QuotaBook
from chamber.common.quotastore import QuotaStore
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import JOBS, JOBS_BUCKET, QUOTA_BUCKET
from chamber.scheduler.core.cycle import SchedulerConfig, SchedulingState
from chamber.scheduler.core.decisions import Decision, Nominate, Preempt, Wait
from chamber.scheduler.core.lifecycle import apply_event, holds_gpus, nominate, note, place, stop_requested
from chamber.scheduler.executor import Executor, SimulatedExecutor

log = get_logger(__name__)


class Scheduler:
    def __init__(
        self, ctx: Context, bus: Bus, ledger: Ledger, store: JobStore, executor: Executor, *, quota_store: QuotaStore
    ) -> None:
        self.ctx = ctx
        self.bus = bus
        self.ledger = ledger
        self.store = store
        self.executor = executor
        self.names = bus.names
        self.records: dict[str, JobRecord] = {}
        self.active: dict[str, JobRecord] = {}
        """The records that are not terminal: what a scheduling cycle looks at."""
        self.revisions: dict[str, int] = {}
        self.nodes: dict[str, Node] = {}
        self.quota: QuotaState | None = None
        self.quota_store = quota_store
        self.quota_config = QuotaConfig()
        self._stop_quota: Callable[[], Any] | None = None
        self.config = SchedulerConfig()
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    async def start(self) -> None:
        for record, revision in (await self.store.load_all()).values():
            self._remember(record, revision)
        await self.bus.watch_latest(self.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        await self.bus.watch_latest(self.names.quota_state(), Decoder(QuotaState), self._on_quota)
        self._stop_quota = await self.quota_store.follow(self._on_quota_config)
        async with self._lock:
            await self._reconcile_ledger()
        await self.executor.resync([r for r in self.records.values() if holds_gpus(r)])
        consumer = self.bus.consumer(
            stream=JOBS,
            durable="scheduler",
            filter_subjects=[self.names.subject("jobs.>")],
            decoder=Decoder(JobEvent),
            handler=self.on_event,
        )
        await consumer.start()
        log.info("scheduler.started", jobs=len(self.records), active=sum(holds_gpus(r) for r in self.records.values()))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_event(self._wake, self.ctx.settings.schedule_interval_s)
            self._wake.clear()
            if stop.is_set():
                break
            try:
                await self.cycle()
            except Exception:
                log.exception("scheduler.cycle_failed")
                await asyncio.sleep(0.5)

    # ---- events -------------------------------------------------------------------------------------------

    async def on_event(self, event: Any) -> None:
        async with self._lock:
            now = self.ctx.clock.now()
            record = self.records.get(event.job_id)
            transition = apply_event(record, event, now)
            if transition is None:
                return
            if transition.release_attempt is not None:
                await self.ledger.release(event.job_id, transition.release_attempt)
            await self._save(transition.record, transition.previous)
            if transition.stop_attempt is not None:
                await self.executor.stop(transition.record, "cancelled")
        self._wake.set()

    def _on_inventory(self, inv: NodeInventory) -> None:
        if self.nodes.get(inv.node.name) != inv.node:
            self.nodes[inv.node.name] = inv.node
            self._wake.set()

    def _on_quota(self, state: QuotaState) -> None:
        self.quota = state

    def _on_quota_config(self, config: QuotaConfig) -> None:
        self.quota_config = config
        self._wake.set()

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
        if self.quota is not None:
            for team, usage in self.quota.teams.items():
                standing[team] = usage.standing
                if usage.budget_state == "blocked-all":
                    blocks[team] = "block-all"
                elif usage.budget_state == "blocked-preemptible":
                    blocks[team] = "block-preemptible"
        return book, standing, blocks

    # ---- the scheduling cycle -----------------------------------------------------------------------------

    async def cycle(self) -> None:
        async with self._lock:
            snap = await self.ledger.snapshot()
            if not snap.ready:
                await self._rebuild_ledger()
                snap = await self.ledger.snapshot()
            book, standing, blocks = self._quota_inputs()
            state = SchedulingState.from_snapshot(
                self.nodes.values(), snap.owners, snap.cordoned, self.active.values(), standing=standing, quota=book,
                budget_blocks=blocks, config=self.config,
            )  # fmt: skip
            now = self.ctx.clock.now()
            for decision in state.cycle(now):
                if not await self._apply(decision, now):
                    self._wake.set()  # the world moved under this cycle: decide again from a fresh snapshot
                    return

    async def _apply(self, decision: Decision, now: float) -> bool:
        """Apply one decision; False when the ledger refused it (stale snapshot) and the cycle must stop."""
        record = self.records[decision.job_id]
        if isinstance(decision, Wait):
            if record.reason != decision.reason:
                await self._save(note(record, now, decision.reason), record.state, publish=False)
            return True
        if isinstance(decision, Nominate):
            await self._save(nominate(record, now, list(decision.gpus), decision.reason), record.state)
            return True
        if isinstance(decision, Preempt):
            if record.attempt != decision.attempt or not holds_gpus(record) or record.stopping:
                return True
            stopping = stop_requested(record, now, decision.reason, decision.interrupt)
            await self._save(stopping, record.state)
            await self.executor.stop(stopping, decision.reason, decision.grace_s)
            return True
        try:
            await self.ledger.claim(decision.job_id, decision.attempt, [g.slot for g in decision.gpus])
        except LedgerConflict as exc:
            log.warning("scheduler.claim_refused", job_id=decision.job_id, error=str(exc))
            return False
        except LedgerNotReady:
            log.warning("scheduler.ledger_lost")
            return False
        placed = place(record, Placement(decision.attempt, list(decision.gpus), decision.reason), now)
        await self._save(placed, record.state)
        await self.bus.publish(
            self.names.decision_placed(placed.id),
            JobPlaced(
                job_id=placed.id, attempt=decision.attempt, gpus=list(decision.gpus), reason=decision.reason,
                decided_at=now,
            ),
            msg_id=f"{placed.id}:{decision.attempt}:placed",
        )  # fmt: skip
        await self.executor.launch(placed)
        return True

    # ---- persistence and ledger recovery ------------------------------------------------------------------

    async def _save(self, record: JobRecord, previous: JobState | None, *, publish: bool = True) -> None:
        if previous is None and record.id not in self.revisions:
            revision = await self.store.create(record)
            if revision is None:  # created before a crash: take what is stored
                stored = await self.store.get(record.id)
                if stored is None:
                    raise RuntimeError(f"job {record.id} exists and does not")
                record, revision = stored
        else:
            revision = await self.store.update(record, self.revisions[record.id])
        self._remember(record, revision)
        if publish:
            await self.bus.publish(
                self.names.decision_state(record.id),
                JobStateChanged(record=record, previous=str(previous or ""), at=record.updated_at),
                msg_id=f"{record.id}:v{record.version}",
            )

    def _remember(self, record: JobRecord, revision: int) -> None:
        self.records[record.id] = record
        self.revisions[record.id] = revision
        if record.state in TERMINAL_STATES:
            self.active.pop(record.id, None)
        else:
            self.active[record.id] = record

    async def _reconcile_ledger(self) -> None:
        """Make the ledger agree with the records after a restart: drop orphan claims, restore missing ones."""
        snap = await self.ledger.snapshot()
        if not snap.ready:
            await self._rebuild_ledger()
            return
        for job_id, claim in snap.claims.items():
            record = self.records.get(job_id)
            if record is None or not holds_gpus(record) or record.attempt != claim.attempt:
                log.info("scheduler.release_orphan_claim", job_id=job_id, attempt=claim.attempt)
                await self.ledger.release(job_id, claim.attempt)
        for record in list(self.records.values()):
            if holds_gpus(record) and record.id not in snap.claims and record.placement is not None:
                try:
                    await self.ledger.claim(record.id, record.attempt, [g.slot for g in record.placement.gpus])
                except LedgerConflict as exc:
                    log.error("scheduler.restore_claim_refused", job_id=record.id, error=str(exc))

    async def _rebuild_ledger(self) -> None:
        claims = [
            Claim(r.id, r.attempt, tuple(g.slot for g in r.placement.gpus))
            for r in self.records.values()
            if holds_gpus(r) and r.placement is not None
        ]
        version = await self.ledger.rebuild(claims)
        log.warning("scheduler.ledger_rebuilt", claims=len(claims), version=version)


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    ledger = ctx.ledger()
    store = JobStore(await bus.key_value(JOBS_BUCKET))
    executor = SimulatedExecutor(bus, ctx.clock)
    quota_store = QuotaStore(await bus.key_value(QUOTA_BUCKET))
    scheduler = Scheduler(ctx, bus, ledger, store, executor, quota_store=quota_store)
    try:
        await scheduler.start()
        await scheduler.run(stop)
    finally:
        await executor.close()
        if scheduler._stop_quota is not None:
            await scheduler._stop_quota()
        await bus.close()
        await ledger.close()
