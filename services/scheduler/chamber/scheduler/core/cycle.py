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
from dataclasses import dataclass, field

from chamber.common.contracts import GpuRef, JobRecord, Node
from chamber.common.priorities import DEFAULT_CLASSES, PriorityClass
from chamber.scheduler.core.backfill import Reservation, reserve
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt, Wait
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.lifecycle import holds_gpus, needs_placement
from chamber.scheduler.core.model import PendingJob, RunningJob, Shape, pending_from, running_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.preemption import plan_preemption
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


@dataclass
class _CycleContext:
    now: float
    blocked: set[Shape] = field(default_factory=set)
    preempt_failed: dict[Shape, int] = field(default_factory=dict)
    reservation: Reservation | None = None
    reserved_free: dict[str, list[int]] = field(default_factory=dict)
    """The reservation's GPUs that are free now, held out of the index."""
    lowest_victim: int | None = None
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
        borrowed: frozenset[str] = frozenset(),
        config: SchedulerConfig | None = None,
    ) -> "SchedulingState":
        state = cls(config)
        state.cordoned = dict(cordoned)
        state.standing = dict(standing or {})
        classes = dict(state.config.classes)
        pending = []
        for record in records:
            if holds_gpus(record):
                state.running[record.id] = running_from(record, classes, record.id in borrowed)
            elif needs_placement(record):
                job = pending_from(record, classes)
                if job.nominated:
                    state.nominated[job.id] = job
                    for ref in job.nominated:
                        state._nominated_slots[ref.slot] = job.id
                else:
                    pending.append(job)
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
        for ref in job.gpus:
            if ref.slot in self.cordoned or ref.slot in self._nominated_slots:
                continue
            self.index.give(ref.node, [ref.index])
        self._invalidate()
        return job

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
            if self._exhausted(job, ctx):
                decisions.append(Wait(job.id, self._waiting_reason(job, ctx)))
                break
            if self._hopeless(job, ctx):
                continue  # its sub-queue stays as it was: nothing this cycle could do for it
            if self._consider(job, ctx, decisions) == "blocked":
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
        return ctx.lowest_victim is None or job.priority <= ctx.lowest_victim

    def _hopeless(self, job: PendingJob, ctx: _CycleContext) -> bool:
        """Already known this cycle: its shape does not fit, it may not preempt, and nothing is left to try."""
        shape = job.shape
        if shape not in ctx.blocked or ctx.reservation is None:
            return False
        may_preempt = (
            ctx.lowest_victim is not None
            and job.priority > ctx.lowest_victim
            and job.priority > ctx.preempt_failed.get(shape, -(10**9))
        )
        if may_preempt:
            return False
        short = job.est_runtime_s is not None and ctx.reservation.start is not None and ctx.reserved_free
        return not short

    def _consider(self, job: PendingJob, ctx: _CycleContext, decisions: list[Decision]) -> str:
        shape = job.shape
        if shape not in ctx.blocked:
            gpus = find_placement(self.index, shape)
            if gpus is not None:
                self._place(job, gpus, _placed_reason(gpus), decisions)
                return "placed"
            ctx.blocked.add(shape)
        if self._backfill_into_reservation(job, ctx, decisions):
            return "placed"
        if (
            ctx.lowest_victim is not None
            and job.priority > ctx.lowest_victim
            and job.priority > ctx.preempt_failed.get(shape, -(10**9))
        ):
            plan = plan_preemption(self.index, job, self.running.values(), ctx.now)
            if plan is not None:
                self._preempt_for(job, plan.victims, plan.gpus, decisions)
                return "nominated"
            ctx.preempt_failed[shape] = job.priority
        if ctx.reservation is None:
            res = reserve(self.index, job, list(self.running.values()), ctx.now)
            if res is not None:
                self._hold(res, ctx)
                decisions.append(Wait(job.id, _reserved_reason(job, res, ctx.now)))
                return "blocked"
        decisions.append(Wait(job.id, self._waiting_reason(job, ctx)))
        return "blocked"

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

    def _place(self, job: PendingJob, gpus: tuple[GpuRef, ...], reason: str, decisions: list[Decision]) -> None:
        by_node: dict[str, list[int]] = {}
        for ref in gpus:
            by_node.setdefault(ref.node, []).append(ref.index)
        for node, indices in by_node.items():
            self.index.take(node, indices)
        self.queue.remove(job.id)
        self.running[job.id] = job.start(gpus, self._ctx.now if self._ctx else 0.0)
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
        for ref in gpus:
            self._nominated_slots[ref.slot] = job.id
            node = self.index.nodes.get(ref.node)
            if node is not None and ref.index in node.free:
                self.index.take(ref.node, [ref.index])

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
