"""One scheduling cycle, in a documented order (least disruptive first):

1. interrupt jobs whose GPUs became unschedulable (fatal faults at once, others with checkpoint grace);
2. place preemptors on the GPUs nominated to them, once their victims have stopped;
3. walk the queue in order; for each job:
   a. place it on free capacity (best fit, topology honoured);
   b. else backfill it into reserved capacity, if its estimate ends before the reservation starts;
   c. else preempt lower-priority work for it, if a plan really fits (the freed GPUs are nominated to it);
   d. else, if nothing is reserved yet, reserve for it (EASY backfill: it is the head that must not starve);
   e. else it waits, with the reason.

`SchedulingState` is pure: built from a snapshot (or kept up to date incrementally by the simulator and the
benchmark), it mutates only itself and returns decisions; the time comes in as an argument.
"""

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from chamber.common.contracts import GpuRef, JobRecord, Node, QuotaConfig
from chamber.common.priorities import DEFAULT_CLASSES, PriorityClass
from chamber.common.quota import QuotaBook, QuotaUsage, admit, borrowed_jobs, may_reclaim
from chamber.scheduler.core.backfill import Reservation, reserve
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt, Wait
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.lifecycle import holds_gpus, needs_placement
from chamber.scheduler.core.model import PendingJob, RunningJob, Shape, pending_from, running_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.preemption import can_be_reclaimed, can_be_victim, plan_preemption
from chamber.scheduler.core.queue import JobQueue, QueueKey, order_key

FATAL_PREFIX = "fatal"


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
    reservations: bool = True
    """EASY backfill reservations for blocked queue heads (off: best-effort FIFO, large jobs may starve)."""
    preemption: bool = True
    strict_fifo_per_team: bool = False
    """A team's blocked head blocks the rest of the team's queue (the isolated-cluster baseline)."""


@dataclass
class _CycleContext:
    now: float
    blocked: set[Shape] = field(default_factory=set)
    preempt_failed: dict[tuple[Shape, str], int] = field(default_factory=dict)
    reservation: Reservation | None = None
    reserved_free: dict[str, list[int]] = field(default_factory=dict)
    """The reservation's GPUs that are free now, held out of the index."""
    lowest_victim: int | None = None
    blocked_teams: set[str] = field(default_factory=set)
    reclaimable: bool = False
    """Some running job is on borrowed capacity: a team within its quota may reclaim it whatever the priorities."""
    backfill_tested: int = 0


class SchedulingState:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.index = FleetIndex()
        self.queue = JobQueue(self.config.standing_cap)
        self.running: dict[str, RunningJob] = {}
        self.nominated: dict[str, PendingJob] = {}
        """Preemptors waiting for their victims to stop, with the GPUs set aside for them (out of the queue)."""
        self._nominated_slots: dict[str, str] = {}
        self.cordoned: dict[str, str] = {}
        self.standing: dict[str, float] = {}
        self.quota: QuotaBook | None = None
        self.usage = QuotaUsage(QuotaBook(QuotaConfig()))
        """(team, pool) -> GPUs held, for quota admission."""
        self.budget_blocks: dict[str, str] = {}
        """team -> budget mode in force ("block-preemptible" or "block-all")."""
        self._ctx: _CycleContext | None = None

    # ---- building -----------------------------------------------------------------------------------------

    @classmethod
    def from_snapshot(
        cls,
        nodes: Iterable[Node],
        owners: Mapping[str, str],
        cordoned: Mapping[str, str],
        records: Iterable[JobRecord],
        *,
        standing: Mapping[str, float] | None = None,
        borrowed: frozenset[str] | None = None,
        quota: QuotaBook | None = None,
        budget_blocks: Mapping[str, str] | None = None,
        config: SchedulerConfig | None = None,
    ) -> "SchedulingState":
        """`borrowed`: jobs on borrowed capacity; computed from `quota` when not given."""
        state = cls(config)
        state.cordoned = dict(cordoned)
        state.standing = dict(standing or {})
        state.quota = quota
        state.budget_blocks = dict(budget_blocks or {})
        classes = dict(state.config.classes)
        nodes = list(nodes)
        pool_of = {n.name: n.pool for n in nodes}
        pending = []
        for record in records:
            if holds_gpus(record):
                assert record.placement is not None
                pool = pool_of.get(record.placement.gpus[0].node, "")
                state.running[record.id] = running_from(record, classes, pool=pool)
            elif needs_placement(record):
                job = pending_from(record, classes)
                if job.nominated:
                    state.nominated[job.id] = job
                    for ref in job.nominated:
                        state._nominated_slots[ref.slot] = job.id
                else:
                    pending.append(job)
        usage: dict[tuple[str, str], int] = {}
        for run in state.running.values():
            key = (run.team, run.pool)
            usage[key] = usage.get(key, 0) + len(run.gpus)
        for nominee in state.nominated.values():
            pool = pool_of.get(nominee.nominated[0].node, "")
            usage[(nominee.team, pool)] = usage.get((nominee.team, pool), 0) + len(nominee.nominated)
        state.usage = QuotaUsage(quota or QuotaBook(QuotaConfig()), usage)
        if borrowed is None and quota is not None:
            borrowed = frozenset(
                borrowed_jobs(quota, ((j.id, j.team, j.pool, len(j.gpus), j.priority, j.started_at)
                                      for j in state.running.values()))
            )  # fmt: skip
        for job_id in borrowed or ():
            if job_id in state.running:
                state.running[job_id].borrowed = True
        held = set(owners) | set(cordoned) | set(state._nominated_slots)
        for node in sorted(nodes, key=lambda n: n.name):
            indices = [g.index for g in node.gpus]
            free = [i for i in indices if f"{node.name}/{i}" not in held]
            model = node.gpus[0].model if node.gpus else ""
            topo = node.topology
            state.index.add_node(
                node.name, pool=node.pool, model=model, rack=topo.rack, zone=topo.zone, capacity=len(indices), free=free
            )
        for job in pending:
            state.queue.push(job)
        return state

    # ---- incremental updates (simulator, benchmark) -------------------------------------------------------

    def submit(self, job: PendingJob, now: float) -> list[Decision]:
        """Queue a job and decide about it at once when nothing ahead of it in its sub-queue waits."""
        self.queue.push(job)
        ctx = self._ctx
        if ctx is None:
            return []
        if not self.queue.is_head(job):
            return [Wait(job.id, "queued behind earlier jobs of the same priority, team and shape")]
        decisions: list[Decision] = []
        ctx.now = now
        self._consider(job, ctx, decisions)
        return decisions

    def release(self, job_id: str) -> RunningJob | None:
        """A running job ended: its GPUs go back to the pool (or to the preemptor they are nominated to)."""
        job = self.running.pop(job_id, None)
        if job is None:
            return None
        if self._quota_on():
            self.usage.add(job.team, job.pool, -len(job.gpus))
        for ref in job.gpus:
            if ref.slot in self.cordoned or ref.slot in self._nominated_slots:
                continue
            self.index.give(ref.node, [ref.index])
        self._invalidate()
        return job

    def cordon(self, slot: str, reason: str) -> None:
        """A GPU became unschedulable: the next cycle interrupts its job (at once when `reason` is fatal)."""
        self.cordoned[slot] = reason
        node, _, index = slot.rpartition("/")
        held = self.index.nodes.get(node)
        if held is not None and int(index) in held.free:
            self.index.take(node, [int(index)])
        self._invalidate()

    def uncordon(self, slot: str) -> None:
        if self.cordoned.pop(slot, None) is None:
            return
        node, _, index = slot.rpartition("/")
        ref = GpuRef(node, int(index))
        if not any(ref in r.gpus for r in self.running.values()) and slot not in self._nominated_slots:
            self.index.give(node, [int(index)])
        self._invalidate()

    def requeue(self, job: PendingJob) -> None:
        self.queue.push(job)
        self._invalidate()

    def _invalidate(self) -> None:
        """Capacity or order changed: the next decision needs a full cycle (and a fresh reservation)."""
        self._drop_reservation()
        self._ctx = None

    # ---- the cycle ----------------------------------------------------------------------------------------

    def cycle(self, now: float) -> list[Decision]:
        self._drop_reservation()
        ctx = self._ctx = _CycleContext(now)
        decisions: list[Decision] = []
        self._interrupt(now, decisions)
        self._place_nominated(decisions)
        ctx.lowest_victim = min(
            (r.priority for r in self.running.values() if r.preemptible and not r.stopping), default=None
        )
        ctx.reclaimable = self._quota_on() and any(r.borrowed and not r.stopping for r in self.running.values())
        cap = self.config.standing_cap
        heads: list[tuple[tuple[int, int, float, float, str], QueueKey]] = []
        for key in self.queue.subqueue_keys():
            head = self.queue.head(key)
            if head is not None:
                heads.append((order_key(head, self.standing, cap), key))
        heapq.heapify(heads)
        tests = 0
        while heads and tests < self.config.max_tests_per_cycle:
            _, key = heapq.heappop(heads)
            job = self.queue.head(key)
            if job is None:
                continue
            tests += 1
            if job.team in ctx.blocked_teams:
                continue
            if self._exhausted(job, ctx):
                decisions.append(Wait(job.id, self._waiting_reason(job, ctx)))
                break
            if self._hopeless(job, ctx):
                continue  # its sub-queue stays as it was: nothing this cycle could do for it
            if self._consider(job, ctx, decisions) == "blocked":
                if self.config.strict_fifo_per_team:
                    ctx.blocked_teams.add(job.team)
                    continue
                tests += self._backfill_behind(key, ctx, decisions)
                continue
            nxt = self.queue.head(key)
            if nxt is not None:
                heapq.heappush(heads, (order_key(nxt, self.standing, cap), key))
        return decisions

    def _exhausted(self, job: PendingJob, ctx: _CycleContext) -> bool:
        """Nothing free, nothing reserved, nobody this job (or anyone after it) may preempt: stop looking."""
        if self.index.free_total() or ctx.reserved_free:
            return False
        if not self.config.preemption:
            return True
        if ctx.reclaimable:
            return False
        return ctx.lowest_victim is None or job.priority <= ctx.lowest_victim

    def _hopeless(self, job: PendingJob, ctx: _CycleContext) -> bool:
        """Already known this cycle: its shape does not fit, it may not preempt, and nothing is left to try."""
        shape = job.shape
        if self._quota_on() or shape not in ctx.blocked or ctx.reservation is None:
            return False
        may_preempt = (
            ctx.lowest_victim is not None
            and job.priority > ctx.lowest_victim
            and job.priority > ctx.preempt_failed.get((shape, ""), -(10**9))
        )
        if may_preempt:
            return False
        short = job.est_runtime_s is not None and ctx.reservation.start is not None and ctx.reserved_free
        return not short

    def _quota_on(self) -> bool:
        return self.quota is not None and self.quota.enabled

    def _options(self, job: PendingJob) -> tuple[list[tuple[Shape, bool, bool]], str]:
        """Where the job may go under its team's quota: (shape pinned to a pool, borrowing?, may reclaim?), pools
        within nominal first; and why not, when nowhere."""
        if not self._quota_on():
            return [(job.shape, False, False)], ""
        assert self.quota is not None
        pools = [job.shape.pool] if job.shape.pool else self.index.pools(job.shape.gpu_model)
        options: list[tuple[Shape, bool, bool]] = []
        refusals: list[str] = []
        gpus = job.shape.gpus
        for pool in pools:
            adm = admit(self.quota, self.usage, job.team, pool, gpus, preemptible=job.preemptible)
            if adm.ok:
                reclaim = may_reclaim(self.quota, self.usage, job.team, pool, gpus)
                options.append((replace(job.shape, pool=pool), adm.borrowing, reclaim))
            else:
                refusals.append(adm.reason)
        options.sort(key=lambda o: o[1])
        return options, "; ".join(refusals[:2])

    def _budget_refusal(self, job: PendingJob) -> str:
        mode = self.budget_blocks.get(job.team)
        if mode == "block-all" or (mode == "block-preemptible" and job.preemptible):
            return f"team {job.team} has used its budget for this period ({mode})"
        return ""

    def _consider(self, job: PendingJob, ctx: _CycleContext, decisions: list[Decision]) -> str:
        refusal = self._budget_refusal(job)
        options, why_not = self._options(job)
        if refusal or not options:
            decisions.append(Wait(job.id, f"waiting: {refusal or why_not}"))
            return "blocked"
        for shape, borrowing, _ in options:
            if shape in ctx.blocked:
                continue
            gpus = find_placement(self.index, shape)
            if gpus is not None:
                note = "; borrowing idle quota" if borrowing else ""
                self._place(job, gpus, _placed_reason(gpus) + note, decisions, borrowing=borrowing)
                return "placed"
            ctx.blocked.add(shape)
        if self._backfill_into_reservation(job, ctx, decisions):
            return "placed"
        if self.config.preemption:
            for shape, _, reclaim in options:
                if self._try_preemption(job, ctx, decisions, shape=shape, reclaim=reclaim):
                    return "nominated"
        if ctx.reservation is None and self.config.reservations:
            pinned = replace(job, shape=options[0][0])
            res = reserve(self.index, pinned, list(self.running.values()), ctx.now)
            if res is not None:
                self._hold(res, ctx)
                decisions.append(Wait(job.id, _reserved_reason(job, res, ctx.now)))
                return "blocked"
        decisions.append(Wait(job.id, self._waiting_reason(job, ctx)))
        return "blocked"

    def _try_preemption(
        self, job: PendingJob, ctx: _CycleContext, decisions: list[Decision], *, shape: Shape, reclaim: bool
    ) -> bool:  # fmt: skip
        """Without quota: any lower-priority preemptible job. With quota: lower-priority jobs of the job's own
        team, and other teams' borrowed jobs only when the job stays within its nominal (reclaim). So teams
        never preempt each other back and forth: only a team within its guarantee takes from a borrower."""
        now = ctx.now
        if self._quota_on():
            key: tuple[Shape, str] = (shape, job.team)
            if not reclaim and not any(
                r.team == job.team and can_be_victim(r, job.priority, now) for r in self.running.values()
            ):
                return False

            assert self.quota is not None
            budgets = {
                team: used - self.quota.quota(team, pool).nominal
                for (team, pool), used in self.usage.items()
                if pool == shape.pool and team != job.team and used > self.quota.quota(team, pool).nominal
            }

            def allowed(r: RunningJob) -> bool:
                if r.team == job.team:
                    return can_be_victim(r, job.priority, now)
                return reclaim and r.pool == shape.pool and r.team in budgets and can_be_reclaimed(r, now)
        else:
            key = (shape, "")
            if ctx.lowest_victim is None or job.priority <= ctx.lowest_victim:
                return False
            allowed = None  # type: ignore[assignment]
            budgets = None
        if job.priority <= ctx.preempt_failed.get(key, -(10**9)):
            return False
        plan = plan_preemption(
            self.index, replace(job, shape=shape), self.running.values(), now, allowed, budgets=budgets
        )
        if plan is None:
            ctx.preempt_failed[key] = job.priority
            return False
        self._preempt_for(job, plan.victims, plan.gpus, decisions)
        return True

    def _backfill_into_reservation(self, job: PendingJob, ctx: _CycleContext, decisions: list[Decision]) -> bool:
        res = ctx.reservation
        if res is None or res.start is None or job.est_runtime_s is None or not ctx.reserved_free:
            return False
        if ctx.now + job.est_runtime_s > res.start:
            return False
        gpus = find_placement(self.index, job.shape, bonus=ctx.reserved_free)
        if gpus is None:
            return False
        for ref in gpus:
            held = ctx.reserved_free.get(ref.node)
            if held is not None and ref.index in held:
                held.remove(ref.index)
                self.index.give(ref.node, [ref.index])
        self._place(
            job, gpus, _placed_reason(gpus) + f"; backfilled: ends before {res.job_id}'s reserved start", decisions
        )
        return True

    def _backfill_behind(self, key: QueueKey, ctx: _CycleContext, decisions: list[Decision]) -> int:
        """After a blocked sub-queue head, look a little further for jobs short enough to backfill."""
        res = ctx.reservation
        budget = self.config.backfill_budget - ctx.backfill_tested
        if res is None or res.start is None or not ctx.reserved_free or budget <= 0:
            return 0
        tested = 0
        for job in list(self.queue.after_head(key, min(budget, self.config.backfill_lookahead))):
            tested += 1
            self._backfill_into_reservation(job, ctx, decisions)
        ctx.backfill_tested += tested
        return tested

    # ---- applying decisions to the working state -----------------------------------------------------------

    def _place(
        self, job: PendingJob, gpus: tuple[GpuRef, ...], reason: str, decisions: list[Decision], borrowing: bool = False
    ) -> None:
        by_node: dict[str, list[int]] = {}
        for ref in gpus:
            by_node.setdefault(ref.node, []).append(ref.index)
        for node, indices in by_node.items():
            self.index.take(node, indices)
        self.queue.remove(job.id)
        pool = self.index.nodes[gpus[0].node].pool
        self.running[job.id] = job.start(gpus, self._ctx.now if self._ctx else 0.0, pool=pool, borrowed=borrowing)
        if self._quota_on():
            self.usage.add(job.team, pool, len(gpus))
        decisions.append(Place(job.id, job.attempt + 1, gpus, reason))

    def _preempt_for(
        self,
        job: PendingJob,
        victims: tuple[RunningJob, ...],
        gpus: tuple[GpuRef, ...],
        decisions: list[Decision],
    ) -> None:
        names = []
        for victim in victims:
            victim.stopping = True
            names.append(victim.id)
            grace = victim.checkpoint_grace_s
            decisions.append(
                Preempt(victim.id, victim.attempt, grace, f"preempted by {job.id} (priority {job.priority}); "
                        f"{grace:g} s to checkpoint", by=job.id)
            )  # fmt: skip
        self._nominate(job, gpus)
        decisions.append(
            Nominate(job.id, gpus, f"preempting {', '.join(names)} for {job.shape.describe()}; starts when they stop")
        )

    def _nominate(self, job: PendingJob, gpus: tuple[GpuRef, ...]) -> None:
        self.queue.remove(job.id)
        self.nominated[job.id] = job
        job.nominated = gpus
        self._count_nomination(job, +1)
        for ref in gpus:
            self._nominated_slots[ref.slot] = job.id
            node = self.index.nodes.get(ref.node)
            if node is not None and ref.index in node.free:
                self.index.take(ref.node, [ref.index])

    def _count_nomination(self, job: PendingJob, sign: int) -> None:
        """Nominated GPUs count against the team's quota from the nomination on, so that nothing else of the
        team is admitted into the room the preemptor was admitted into."""
        if not job.nominated:
            return
        node = self.index.nodes.get(job.nominated[0].node)
        if node is not None:
            self.usage.add(job.team, node.pool, sign * len(job.nominated))

    def _place_nominated(self, decisions: list[Decision]) -> None:
        for job_id, job in list(self.nominated.items()):
            gpus = job.nominated
            blocked_by = [r.id for r in self.running.values() if any(g in gpus for g in r.gpus)]
            if any(g.slot in self.cordoned for g in gpus):
                self._drop_nomination(job_id)  # the plan no longer holds: the job competes again
                continue
            if blocked_by:
                decisions.append(
                    Wait(job_id, f"waiting for {', '.join(sorted(blocked_by))} to stop (preempted for it)")
                )
                continue
            self._drop_nomination(job_id)
            self._place(job, gpus, _placed_reason(gpus) + " (on the GPUs it preempted for)", decisions)

    def _drop_nomination(self, job_id: str) -> None:
        """Give the nominated GPUs back and put the job back in the queue (placed or competing again)."""
        job = self.nominated.pop(job_id, None)
        if job is None:
            return
        self._count_nomination(job, -1)
        for ref in job.nominated:
            if self._nominated_slots.get(ref.slot) == job_id:
                del self._nominated_slots[ref.slot]
                owned = any(ref in r.gpus for r in self.running.values())
                if not owned and ref.slot not in self.cordoned:
                    self.index.give(ref.node, [ref.index])
        job.nominated = ()
        self.queue.push(job)

    def _interrupt(self, now: float, decisions: list[Decision]) -> None:
        if not self.cordoned:
            return
        bad_nodes = {slot.rsplit("/", 1)[0] for slot in self.cordoned}
        for job in self.running.values():
            if job.stopping or not any(g.node in bad_nodes for g in job.gpus):
                continue
            bad = [g.slot for g in job.gpus if g.slot in self.cordoned]
            if not bad:
                continue
            reason = self.cordoned[bad[0]]
            fatal = reason.startswith(FATAL_PREFIX)
            grace = 0.0 if fatal else job.checkpoint_grace_s
            job.stopping = True
            decisions.append(
                Preempt(job.id, job.attempt, grace, f"interrupted: GPU {bad[0]} unschedulable ({reason})",
                        interrupt=True)
            )  # fmt: skip

    def _hold(self, res: Reservation, ctx: _CycleContext) -> None:
        ctx.reservation = res
        for ref in res.gpus:
            node = self.index.nodes.get(ref.node)
            if node is not None and ref.index in node.free:
                ctx.reserved_free.setdefault(ref.node, []).append(ref.index)
        for node_name, indices in ctx.reserved_free.items():
            self.index.take(node_name, indices)

    def _drop_reservation(self) -> None:
        ctx = self._ctx
        if ctx is None:
            return
        for node_name, indices in ctx.reserved_free.items():
            self.index.give(node_name, indices)
        ctx.reserved_free = {}
        ctx.reservation = None

    def _waiting_reason(self, job: PendingJob, ctx: _CycleContext) -> str:
        free = self.index.free_in(self.index.partitions_for(job.shape))
        text = f"waiting for {job.shape.describe()}; {free} free"
        if ctx.reservation is not None:
            text += f"; capacity reserved for {ctx.reservation.job_id}"
        return text


def _placed_reason(gpus: tuple[GpuRef, ...]) -> str:
    nodes = sorted({g.node for g in gpus})
    shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
    return f"placed on {shown}"


def _reserved_reason(job: PendingJob, res: Reservation, now: float) -> str:
    what = job.shape.describe()
    if res.start is None:
        return f"waiting for {what}; reserved (earliest start unknown: running jobs have no runtime estimate)"
    return f"waiting for {what}; reserved, earliest start in {_duration(res.start - now)}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
