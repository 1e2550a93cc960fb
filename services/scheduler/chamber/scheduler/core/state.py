"""The scheduler's working state, kept up to date incrementally: who waits, who runs where, what is free.

One `SchedulingState` lives as long as the scheduler (service or simulator). Events change it in O(job):
`submit` queues a job, `release` gives a finished or stopped job's GPUs back, `requeue` returns a preempted job to
the queue, `cordon`/`uncordon` follow health. A scheduling cycle (`chamber.scheduler.core.cycle`) reads it and
commits its decisions into it (`place`, `nominate`, `mark_stopping`). It is rebuilt from a snapshot only at
start-up and after the ledger was lost (`chamber.scheduler.core.snapshot`).

Whatever invalidates what an earlier cycle concluded (capacity freed, a cordon, quota or order changed) drops the
cycle's context, so the next decision runs a full cycle; an arrival with the context intact is decided on its own.
"""

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from sys import intern
from typing import TYPE_CHECKING, Literal

from chamber.common.contracts import Cordon, GpuRef, QuotaConfig
from chamber.common.priorities import DEFAULT_CLASSES, PriorityClass
from chamber.common.quota import QuotaBook, QuotaUsage, borrowed_jobs
from chamber.scheduler.core.decisions import Decision, Place
from chamber.scheduler.core.estimates import RuntimePredictor
from chamber.scheduler.core.fill_order import FillOrder
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import PendingJob, RunningJob, slot_of
from chamber.scheduler.core.queue import FloorClock, JobQueue

if TYPE_CHECKING:
    from chamber.scheduler.core.cycle import CycleContext


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    classes: Mapping[str, PriorityClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    backfill_lookahead: int = 16
    """Jobs looked at after a blocked sub-queue head, for ones short enough to backfill."""
    backfill_budget: int = 512
    """Look-ahead jobs per cycle in all (like Slurm's bf_max_job_test): bounds a cycle with a deep queue."""
    max_tests_per_cycle: int = 5000
    standing_cap: int = 3
    """A job preempted n times is ordered ahead of its class peers by min(n, cap) steps: it gains standing."""
    max_reservations: int = 1
    """EASY backfill reservations for the first blocked queue heads (0: best-effort FIFO, large jobs may starve;
    1: classic EASY; several: several nodes drain at once for the gangs waiting, as Slurm's backfill reserves for
    every job it tests)."""
    sticky_reservations: Literal["all", "aged", "none"] = "none"
    """Which jobs holding a reservation keep it (its place ahead of their peers and its planned GPUs) in the next
    cycles: every one, only aged ones (they have waited `max_wait_s`), or none (re-planned from scratch)."""
    preemption: bool = True
    strict_fifo_per_team: bool = False
    """A team's blocked head blocks the rest of the team's queue (the isolated-cluster baseline)."""
    strict_fifo: bool = False
    """The first blocked head blocks the whole queue (the shared-FIFO baseline)."""
    order: Literal["fifo", "spf", "las"] = "spf"
    """How jobs of one priority, standing and team are ordered (see `queue`): submit time, shortest predicted
    GPU-time first, or least attained GPU-time first."""
    rank_gpu_time: bool = True
    """`spf` ranks by predicted GPU-time (GPUs x time, Helios's QSSF); off: by predicted time alone, which does not
    push wide jobs back."""
    backfill_on_predictions: bool = True
    """Backfill on min(user's estimate, prediction); off: predictions only order the queue, and backfill trusts
    only users' estimates (upper bounds a job may be held to)."""
    rank_first: bool = True
    """Order by the policy's rank before the teams' fair-share standing (guarantees still come first: the quota's
    two passes and reclaim); off: the rank orders only within a standing."""
    predict: bool = True
    """Learn runtimes from finished jobs (`estimates`) and use them for ordering and backfill."""
    max_wait_s: float | None = 86_400.0
    """Age protection: a job waiting longer goes ahead of its priority peers (None: off)."""
    consolidate: bool = True
    """A multi-GPU job that fits on no node while the pool's free GPUs suffice gets room by moving a few small
    preemptible jobs elsewhere, each started again at once (`consolidation`); looked at after every waiting job
    had its turn at the free GPUs, so a move only uses GPUs nobody waiting could take."""
    consolidation_max_moved_gpus: int = 4
    """GPUs moved at most to open room for one job (8 opened room for more jobs in the contended replays, but
    moved twice as many and cost the average JCT 0.5% at load 0.8; docs/simulator.md)."""
    reclaim_past_guarantee: bool = True
    """A team below its guarantee may reclaim borrowed GPUs for its smallest waiting job even when that job takes
    it past the guarantee, from teams that would still borrow at least as much (see `cycle._try_preemption`);
    off: only a job that fits the team's unused guarantee reclaims (Kueue's classic `reclaimWithinCohort`), and
    a team short by less than its smallest job's width stays short until something ends."""


UNKNOWN = float("inf")
"""The rank of a job nothing is known about under `spf`: after the predicted ones, in submit order."""


class SchedulingState:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.index = FleetIndex()
        self.predictor = RuntimePredictor()
        self.queue = JobQueue(
            self.config.standing_cap, rank=self._rank, rank_first=self.config.rank_first,
            aging=self.config.max_wait_s is not None,
        )  # fmt: skip
        self.running: dict[str, RunningJob] = {}
        self.holder: dict[str, str] = {}
        """slot -> the running job that holds it."""
        self.contested: dict[str, list[str]] = {}
        """slot -> the other running jobs whose records name it too (a deposed leader's late write can leave two
        records on one GPU; the ledger backs the holder, the others are being stopped): it is free only when the
        last of them has ended."""
        self.nominated: dict[str, PendingJob] = {}
        """Preemptors waiting for their victims to stop, with the GPUs set aside for them (out of the queue)."""
        self.nominated_slots: dict[str, str] = {}
        self.cordoned: dict[str, Cordon] = {}
        self.standing: dict[str, float] = {}
        self.quota: QuotaBook | None = None
        self.usage = QuotaUsage(QuotaBook(QuotaConfig()))
        """(team, pool) -> GPUs held, for quota admission."""
        self.budget_blocks: dict[str, str] = {}
        """team -> budget mode in force ("block-preemptible" or "block-all")."""
        self.by_team: dict[tuple[str, str], FillOrder] = {}
        """(team, pool) -> its running jobs there, in the order they fill its quota."""
        self.preemptible_usage: dict[str, dict[str, dict[int, int]]] = {}
        """team -> pool -> priority -> GPUs held by preemptible jobs: what a team's higher-priority job may displace
        (by team, then pool: asked ~2,000 times a cycle, and a (team, pool) key was a tuple to make, hash and compare
        each time)."""
        self.floors: dict[tuple[str, str], float] = {}
        """(team, pool) -> the priority a head must exceed for the team's guarantee there to admit it (-inf: the team
        is below its guarantee; `split`), kept from cycle to cycle and forgotten when the team's
        usage or preemptible usage there changes, or the quota book does: with a thousand teams, working each out
        again in every cycle was an eighth of the split, and most teams' are as they were."""
        self.floor_clocks: dict[str, FloorClock] = {}
        """team -> the count of changes to its `floors` (every team's counts move on when the quota book does): what
        the split keeps each item's side by (`SubQueue.split_clock`, `Parking.split_clock`)."""
        self.split_index: FleetIndex | None = None
        self.split_partitions = 0
        """The fleet index, and how many partitions it had, when the split last worked out sides: a shape may use
        other pools once either changes."""
        self.ctx: CycleContext | None = None
        """What the last cycle concluded, while nothing has invalidated it."""
        self.arrivals: list[str] = []
        """Jobs submitted since the last decision, to decide on their own while the context holds."""
        self.moves: dict[str, tuple[GpuRef, ...]] = {}
        """Running jobs being moved (consolidation) -> the free GPUs held for them until they have stopped."""
        self.relocated: set[str] = set()
        """Moved jobs nominated to their new GPUs, not placed yet."""
        self.unheld: set[str] = set()
        """Jobs put back in the queue after GPUs were held for them (a nomination or a move's hold dropped, a
        placement refused): their records may still name those GPUs (`Controller.decide` tells them)."""

    # ---- building (start-up, tests) --------------------------------------------------------------------------

    @classmethod
    def from_snapshot(cls, *args: object, **kwargs: object) -> "SchedulingState":
        """See `chamber.scheduler.core.snapshot.build_state`."""
        from chamber.scheduler.core.snapshot import build_state

        return build_state(*args, **kwargs)  # type: ignore[arg-type]

    # ---- deciding ----------------------------------------------------------------------------------------------

    def cycle(self, now: float) -> list[Decision]:
        """A full scheduling cycle (see `chamber.scheduler.core.cycle`)."""
        from chamber.scheduler.core.cycle import run_cycle

        self.arrivals.clear()
        return run_cycle(self, now)

    def decide(self, now: float) -> list[Decision]:
        """Decide what changed since the last decision: a full cycle if anything invalidated the last one, else
        only the jobs that arrived since (each where nothing ahead of it in its sub-queue waits)."""
        if self.ctx is None:
            return self.cycle(now)
        from chamber.scheduler.core.cycle import decide_arrivals

        arrived, self.arrivals = self.arrivals, []
        return decide_arrivals(self, self.ctx, arrived, now)

    def submit(self, job: PendingJob, now: float) -> list[Decision]:
        """Queue a job and decide about it at once (see `decide`)."""
        self.add(job)
        return self.decide(now)

    def _rank(self, job: PendingJob) -> float:
        """The job's rank in its sub-queue under the order policy; predicts its runtime on the way in."""
        config = self.config
        uses_prediction = config.order == "spf" or config.backfill_on_predictions
        if config.predict and uses_prediction and job.predicted_s is None:
            total = self.predictor.predict(job.team, job.name, job.shape.gpus)
            if total is not None:
                job.predicted_s = max(0.0, total - job.run_s)
                job.backfill_on_prediction = config.backfill_on_predictions
        predicted = job.predicted_s
        if config.order == "spf":
            if predicted is None:
                return UNKNOWN
            return predicted * job.shape.gpus if config.rank_gpu_time else predicted
        if config.order == "las":
            return job.run_s * job.shape.gpus
        return 0.0

    # ---- incremental updates --------------------------------------------------------------------------------

    def add(self, job: PendingJob) -> None:
        """Queue a new job; it is decided by the next `decide`."""
        self.queue.push(job)
        self.arrivals.append(job.id)

    def release(self, job_id: str) -> RunningJob | None:
        """A running job ended: its GPUs go back to the pool (or to the preemptor they are nominated to)."""
        job = self.running.pop(job_id, None)
        if job is None:
            return None
        self.untrack(job)
        if self.quota_on:
            self._use(job.team, job.pool, -len(job.gpus))
        self.count_preemptible(job, -1)
        for ref in job.gpus:
            slot = slot_of(ref)
            if slot in self.contested and self._uncontest(slot, job_id):
                continue  # another running job is on it still: not free
            if self.holder.get(slot) != job_id:
                continue
            del self.holder[slot]
            if slot in self.cordoned or slot in self.nominated_slots:
                continue
            self.index.give(ref.node, [ref.index])
        self.invalidate()
        return job

    def contest(self, slot: str, job_id: str, *, holds: bool) -> None:
        """A second running job's record names `slot`: it holds it (`holds`: the ledger backs it), or waits behind
        the holder (see `contested`)."""
        holder = self.holder.get(slot)
        if holder is None or holder == job_id:
            self.holder[slot] = job_id
            return
        if holds:
            self.holder[slot], job_id = job_id, holder
        self.contested.setdefault(slot, []).append(job_id)

    def _uncontest(self, slot: str, job_id: str) -> bool:
        """`job_id` ended on a contested slot: True when another running job is on it still (then holding it)."""
        others = self.contested[slot]
        if job_id in others:
            others.remove(job_id)
        elif self.holder.get(slot) == job_id:
            while others and others[0] not in self.running:
                others.pop(0)
            if others:
                self.holder[slot] = others.pop(0)
        if not others:
            del self.contested[slot]
        return self.holder.get(slot) != job_id

    def add_running(self, job: RunningJob, *, yields: Container[str] = ()) -> None:
        """A job that already holds its GPUs (re-read from the store); on the slots in `yields` (where it did not
        hold the GPU before) a job that holds it keeps it (see `contested`)."""
        job.team, job.pool = intern(job.team), intern(job.pool)  # as `JobQueue.push` does
        self.running[job.id] = job
        self.track(job)
        self.count_preemptible(job, +1)
        if self.quota_on:
            self._use(job.team, job.pool, len(job.gpus))
        by_node: dict[str, list[int]] = {}
        for ref in job.gpus:
            self.contest(ref.slot, job.id, holds=ref.slot not in yields)
            by_node.setdefault(ref.node, []).append(ref.index)
        for node, indices in by_node.items():
            held = self.index.nodes.get(node)
            if held is not None:
                self.index.take(node, [i for i in indices if i in held.free])
        self.invalidate()

    def add_nominated(self, job: PendingJob) -> None:
        """A preemptor already holding a nomination (loaded at start-up, or re-read from the store)."""
        self.nominate(job, job.nominated)

    def requeue(self, job: PendingJob) -> None:
        gpus = self.moves.pop(job.id, None)
        if gpus is not None:
            job.waiting_for = ()
            self.nominate(job, gpus)  # a moved job goes straight to the GPUs held for it
            self.relocated.add(job.id)
        else:
            self.queue.push(job)
        self.invalidate()

    def hold_move(self, job_id: str, gpus: tuple[GpuRef, ...]) -> None:
        """Hold free GPUs for a running job that is being moved, until it has stopped and is requeued."""
        self.moves[job_id] = gpus
        by_node: dict[str, list[int]] = {}
        for ref in gpus:
            self.nominated_slots[ref.slot] = job_id
            by_node.setdefault(ref.node, []).append(ref.index)
        for node, indices in by_node.items():
            self.index.take(node, indices)

    def restore_move(self, job_id: str, gpus: tuple[GpuRef, ...]) -> bool:
        """Hold again, after a restart, the GPUs a record says were held for a job being moved, if each is still
        free (not held, nominated or cordoned); if not, the job competes in the queue like any other."""
        for ref in gpus:
            node = self.index.nodes.get(ref.node)
            if (
                node is None
                or ref.index not in node.free
                or ref.slot in self.nominated_slots
                or ref.slot in self.cordoned
            ):
                return False
        self.hold_move(job_id, gpus)
        return True

    def drop_move(self, job_id: str) -> None:
        """A job being moved ended instead (finished, cancelled, lost): the GPUs held for it are free again."""
        gpus = self.moves.pop(job_id, None)
        if gpus is None:
            return
        for ref in gpus:
            slot = ref.slot
            if self.nominated_slots.get(slot) == job_id:
                del self.nominated_slots[slot]
                if slot not in self.holder and slot not in self.cordoned:
                    self.index.give(ref.node, [ref.index])
        self.invalidate()

    def withdraw(self, job_id: str) -> None:
        """A waiting job left (cancelled): out of the queue, its nomination (if any) given back (free GPUs: the
        next decision is a full cycle, as after a release)."""
        if job_id in self.nominated:
            self.drop_nomination(job_id, requeue=False)
            self.invalidate()
        self.queue.remove(job_id)

    def mark_stopping(self, job_id: str) -> None:
        """The job was cancelled (stopped at once): it is nobody's victim any more."""
        job = self.running.get(job_id)
        if job is not None:
            job.stopping = job.at_once = True

    def set_started(self, job_id: str, started_at: float) -> None:
        job = self.running.get(job_id)
        if job is not None and job.started_at != started_at:
            if job.est_end is not None:
                job.est_end += started_at - job.started_at
            self.untrack(job)
            job.started_at = started_at
            self.track(job)

    def cordon(self, slot: str, cordon: Cordon) -> None:
        """A GPU became unschedulable: the next cycle interrupts its job (at once when the cordon is fatal)."""
        if self.cordoned.get(slot) == cordon:
            return
        self.cordoned[slot] = cordon
        node, _, index = slot.rpartition("/")
        held = self.index.nodes.get(node)
        if held is not None and int(index) in held.free:
            self.index.take(node, [int(index)])
        self.invalidate()

    def uncordon(self, slot: str) -> None:
        if self.cordoned.pop(slot, None) is None:
            return
        node, _, index = slot.rpartition("/")
        if slot not in self.holder and slot not in self.nominated_slots:
            self.index.give(node, [int(index)])
        self.invalidate()

    def set_quota(
        self,
        book: QuotaBook | None,
        standing: Mapping[str, float] | None = None,
        budget_blocks: Mapping[str, str] | None = None,
    ) -> None:
        """New quota configuration, capacity, standings or budget blocks: usage is re-counted under the new book."""
        self.quota = book
        self.standing = dict(standing or {})
        self.budget_blocks = dict(budget_blocks or {})
        usage: dict[tuple[str, str], int] = {}
        for run in self.running.values():
            usage[(run.team, run.pool)] = usage.get((run.team, run.pool), 0) + len(run.gpus)
        for nominee in self.nominated.values():
            pool = self.pool_of(nominee.nominated[0].node)
            usage[(nominee.team, pool)] = usage.get((nominee.team, pool), 0) + len(nominee.nominated)
        self.usage = QuotaUsage(book or QuotaBook(QuotaConfig()), usage)
        self.floors = {}
        self.forget_sides()
        self.queue.wake_all()
        self.mark_borrowed()
        self.invalidate()

    def mark_borrowed(self, team: str | None = None, pool: str | None = None) -> None:
        """Which running jobs are on borrowed capacity, from scratch (at start-up and when quotas change; a
        placement marks its own job as it is made, and re-marks its team's jobs in the pool when it was admitted
        by counting the team's lower-priority work as borrowing)."""
        if team is not None and pool is not None:
            order = self.by_team.get((team, pool))
            if order is not None:
                order.mark_borrowed(self.quota_nominal(team, pool) if self.quota_on else None)
            return
        jobs = list(self.running.values())
        borrowed: set[str] = set()
        if self.quota is not None and self.quota.enabled:
            borrowed = borrowed_jobs(self.quota, ((j.id, j.team, j.pool, len(j.gpus), j.priority, j.started_at)
                                                  for j in jobs))  # fmt: skip
        for job in jobs:
            job.borrowed = job.id in borrowed

    def invalidate(self) -> None:
        """Capacity or order changed: the next decision needs a full cycle (and a fresh reservation)."""
        ctx = self.ctx
        if ctx is not None:
            ctx.release_reservation(self.index, self.cordoned)
        self.ctx = None

    # ---- committing decisions --------------------------------------------------------------------------------

    @property
    def quota_on(self) -> bool:
        return self.quota is not None and self.quota.enabled

    def pool_of(self, node: str) -> str:
        held = self.index.nodes.get(node)
        return held.pool if held is not None else ""

    def place(self, job: PendingJob, gpus: tuple[GpuRef, ...], reason: str, now: float, borrowing: bool) -> Place:
        by_node: dict[str, list[int]] = {}
        for ref in gpus:
            by_node.setdefault(ref.node, []).append(ref.index)
            self.holder[slot_of(ref)] = job.id
        for node, indices in by_node.items():
            self.index.take(node, indices)
        self.queue.remove(job.id)
        pool = self.pool_of(gpus[0].node)
        run = self.running[job.id] = job.start(gpus, now, pool=pool, borrowed=borrowing)
        self.track(run)
        self.count_preemptible(run, +1)
        if self.quota_on:
            beyond = self.usage.used_in(job.team, pool) + len(gpus) > self.quota_nominal(job.team, pool)
            self._use(job.team, pool, len(gpus))
            if beyond and not borrowing:
                self.mark_borrowed(job.team, pool)  # admitted by counting the team's lower work as borrowing
        return Place(job.id, job.attempt + 1, gpus, reason)

    def track(self, job: RunningJob) -> None:
        """Keep a running job in its team's fill order (`by_team`)."""
        order = self.by_team.get((job.team, job.pool))
        if order is None:
            order = self.by_team[(job.team, job.pool)] = FillOrder()
        order.add(job)

    def untrack(self, job: RunningJob) -> None:
        order = self.by_team.get((job.team, job.pool))
        if order is not None:
            order.remove(job.id)
            if not order:
                del self.by_team[(job.team, job.pool)]

    def _use(self, team: str, pool: str, gpus: int) -> None:
        """The team's quota usage in `pool` changes by `gpus`."""
        self.usage.add(team, pool, gpus)
        self._forget_floor(team, pool)

    def count_preemptible(self, job: RunningJob, sign: int) -> None:
        if not job.preemptible:
            return
        self._forget_floor(job.team, job.pool)
        pools = self.preemptible_usage.get(job.team)
        if pools is None:
            pools = self.preemptible_usage[job.team] = {}
        counts = pools.get(job.pool)
        if counts is None:
            counts = pools[job.pool] = {}
        counts[job.priority] = counts.get(job.priority, 0) + sign * len(job.gpus)

    def _forget_floor(self, team: str, pool: str) -> None:
        self.floors.pop((team, pool), None)
        clock = self.floor_clocks.get(team)
        if clock is not None:
            clock.changes += 1

    def floor_clock(self, team: str) -> FloorClock:
        clock = self.floor_clocks.get(team)
        if clock is None:
            clock = self.floor_clocks[team] = FloorClock()
        return clock

    def forget_sides(self) -> None:
        """No item's kept side of the split holds (the quota book changed, or the pools a shape may use)."""
        for clock in self.floor_clocks.values():
            clock.changes += 1

    def preemptible_held(self, team: str, pool: str) -> dict[int, int] | None:
        """Priority -> GPUs the team holds in `pool` with preemptible jobs (None: none ever)."""
        pools = self.preemptible_usage.get(team)
        return pools.get(pool) if pools is not None else None

    def preemptible_below(self, team: str, pool: str, priority: int) -> int:
        """GPUs the team holds in `pool` with preemptible jobs of lower priority than `priority`."""
        counts = self.preemptible_held(team, pool)
        total = 0
        if counts:
            for p, n in counts.items():  # a handful of priorities: a plain loop, not sum() over a generator
                if p < priority:
                    total += n
        return total

    def quota_nominal(self, team: str, pool: str) -> int:
        return self.quota.quota(team, pool).nominal if self.quota is not None else 0

    def unplace(self, job_id: str, job: PendingJob) -> None:
        """A placement the ledger refused: the GPUs are free again (as far as we know) and the job waits."""
        self.release(job_id)
        self.queue.push(job)
        self.unheld.add(job_id)

    def nominate(self, job: PendingJob, gpus: tuple[GpuRef, ...]) -> None:
        self.queue.remove(job.id)
        self.nominated[job.id] = job
        job.nominated = gpus
        self._count_nomination(job, +1)
        for ref in gpus:
            self.nominated_slots[ref.slot] = job.id
            node = self.index.nodes.get(ref.node)
            if node is not None and ref.index in node.free:
                self.index.take(ref.node, [ref.index])

    def drop_nomination(self, job_id: str, *, requeue: bool = True) -> PendingJob | None:
        """Give the nominated GPUs back and (unless it left) put the job back in the queue."""
        job = self.nominated.pop(job_id, None)
        if job is None:
            return None
        self.relocated.discard(job_id)
        self._count_nomination(job, -1)
        for ref in job.nominated:
            slot = ref.slot
            if self.nominated_slots.get(slot) == job_id:
                del self.nominated_slots[slot]
                if slot not in self.holder and slot not in self.cordoned:
                    self.index.give(ref.node, [ref.index])
        job.nominated = ()
        if requeue:
            self.queue.push(job)
            self.unheld.add(job_id)
        return job

    def _count_nomination(self, job: PendingJob, sign: int) -> None:
        """Nominated GPUs count against the team's quota from the nomination on, so that nothing else of the
        team is admitted into the room the preemptor was admitted into."""
        if job.nominated and self.quota_on:
            self._use(job.team, self.pool_of(job.nominated[0].node), sign * len(job.nominated))

    # ---- questions ---------------------------------------------------------------------------------------------

    def held_slots(self) -> set[str]:
        """Every slot not free for new work: held by a job, nominated to a preemptor or cordoned."""
        return set(self.holder) | set(self.nominated_slots) | set(self.cordoned)
