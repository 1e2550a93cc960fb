"""One scheduling cycle, in a documented order (least disruptive first):

1. interrupt jobs whose GPUs became unschedulable (fatal cordons at once, degraded ones with checkpoint grace; a
   fatal one cuts the grace of a job already stopping);
2. place preemptors on the GPUs nominated to them, once their victims have stopped;
3. walk the queue in order; for each job:
   a. place it on free capacity (best fit, topology honoured);
   b. else backfill it into reserved capacity, if its estimate ends before that reservation starts;
   c. else preempt lower-priority work for it, if a plan really fits (the freed GPUs are nominated to it); under
      quotas, a job whose team's quota is full of its own lower-priority work displaces that work, and a team
      below its guarantee reclaims borrowed GPUs for its smallest waiting job even when that job takes it a
      little past the guarantee (`_try_preemption`);
   d. else, while fewer than `max_reservations` heads hold one, reserve for it (EASY backfill: the first
      blocked heads must not starve; with several, several nodes drain at once for the gangs waiting);
   e. else it waits, with the reason.

The cycle reads and commits into a `SchedulingState`; what it concluded (blocked shapes, reservations, failed
preemption plans) is kept in a `CycleContext` until something invalidates it, so an arrival in between is
decided against it without a new cycle (`decide_arrivals`).
"""

import bisect
import heapq
import itertools
from collections.abc import Collection, Container, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from chamber.common.contracts import Cordon, GpuRef
from chamber.common.quota import admits, may_reclaim
from chamber.scheduler.core.admission import (
    Option,
    QuotaNeed,
    admissions,
    admitted_after,
    budget_refusal,
    displacement,
    reclaim_past,
)
from chamber.scheduler.core.backfill import Release, Reservation, release_order, reserve
from chamber.scheduler.core.consolidation import plan_consolidation, single_node_jobs
from chamber.scheduler.core.decisions import Decision, Nominate, Preempt, Wait
from chamber.scheduler.core.fleet import FleetIndex
from chamber.scheduler.core.model import PendingJob, RunningJob, Shape
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.preemption import (
    VictimCost,
    can_be_reclaimed,
    can_be_victim,
    plan_preemption,
    victim_cost,
)
from chamber.scheduler.core.queue import (
    WOKEN,
    Entry,
    Order,
    ParkGroup,
    Parking,
    QueueKey,
    SubQueue,
    Walk,
    entry,
)
from chamber.scheduler.core.reasons import Reason, WaitKind, placed_on
from chamber.scheduler.core.split import Lane, Split
from chamber.scheduler.core.state import SchedulingState

NO_PRIORITY = -(10**9)
Turn = tuple[int, Entry]
"""(pass, mark): when in the walk something was decided, as its first (0) or second (1) pass and the greatest item
that pass had taken by then. Turns order as the walk went, also where it takes an item out of queue order (one
pushed with a smaller order than an item already taken: a sticky reservation orders its job ahead); a head the
walk did not take (a closed lane's) has its turn before the first item taken that comes after it in queue order,
so `(pass, its item)` orders with the others."""


@dataclass
class CycleContext:
    now: float
    blocked: set[Shape] = field(default_factory=set)
    preempt_failed: dict[tuple[Shape, str], int] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
    held: list[dict[str, list[int]]] = field(default_factory=list)
    """Per reservation, its GPUs that are free now, held out of the index."""
    lowest_victim: int | None = None
    blocked_teams: set[str] = field(default_factory=set)
    reclaimable: bool = False
    """Some running job is on borrowed capacity: a team within its quota may reclaim it whatever the priorities."""
    seq: Iterator[int] = field(default_factory=itertools.count)
    """Numbers of the sub-queues woken in a cycle's walk (see `queue.Entry`)."""
    backfill_tested: int = 0
    tests: int = 0
    """Sub-queue heads looked at in this cycle (bounded by `max_tests_per_cycle`)."""
    fresh: set[str] = field(default_factory=set)
    """Jobs placed under this context."""
    borrowing: bool = True
    """Whether jobs that would borrow may be placed now (the cycle's second pass, and arrivals after it)."""
    refused: dict[tuple[str, str | None, str | None, bool, int], tuple[int, Reason]] = field(default_factory=dict)
    """(team, pool, model, preemptible, priority) -> the fewest GPUs its quota refused this cycle, and why: a
    larger job of the same kind is refused too (usage only grows within a cycle), without asking again."""
    cost_at: float = 0.0
    _victims: list[tuple[VictimCost, RunningJob]] | None = None
    _by_team: dict[str, list[tuple[VictimCost, RunningJob]]] | None = None
    _sorted_teams: set[str] = field(default_factory=set)
    _releases: list[Release] | None = None
    _stopping: dict[tuple[str, str], list[RunningJob]] | None = None
    _pools: dict[tuple[str | None, str | None], list[str]] = field(default_factory=dict)
    _pinned: dict[tuple[Shape, str], Shape] = field(default_factory=dict)
    pinned_lists: dict[Shape, list[Shape]] = field(default_factory=dict)
    """Per shape, `_Cycle._pinned_shapes` (a cycle asks it thousands of times); not to be changed by its users."""
    to_consolidate: list[tuple[Turn | None, PendingJob]] = field(default_factory=list)
    """Multi-GPU jobs the walk found no room for, in the walk's order, each with the turn it was found at (None
    outside a walk): room is opened for them after it."""
    consolidation_tails: list["Tail"] = field(default_factory=list)
    """Lanes of sub-queues closed while room might still be opened for their shape after the walk (see
    `_Cycle._shape_hopeless`)."""
    consolidation_failed: set[Shape] = field(default_factory=set)
    """Shapes no consolidation plan opened room for in this context (room only gets scarcer within it)."""
    unfit: set[tuple[str, Shape]] = field(default_factory=set)
    """(reservation's job, shape): the shape fits neither on that reservation's held GPUs nor with free ones, so
    no job of it backfills there in this context (held and free GPUs only get fewer within it, see `more_free`)."""
    _on_node: dict[str, list[RunningJob]] | None = None
    _smallest: dict[str, int] | None = None

    def smallest_waiting(self, state: SchedulingState) -> dict[str, int]:
        """Per team, the fewest GPUs any of its queued jobs asks for, once per context (O(teams)): only that
        job may reclaim past the team's guarantee."""
        if self._smallest is None:
            self._smallest = state.queue.smallest_by_team()
        return self._smallest

    def on_node(self, state: SchedulingState) -> dict[str, list[RunningJob]]:
        """Running jobs held on one node alone, by node, once per context (jobs placed since are not movable)."""
        if self._on_node is None:
            self._on_node = single_node_jobs(state.running.values())
        return self._on_node

    def pools_of(self, state: SchedulingState, shape: Shape) -> list[str]:
        """The pools a shape may use (its own, or every pool of its GPU model); cached for the cycle."""
        key = (shape.pool, shape.gpu_model)
        pools = self._pools.get(key)
        if pools is None:
            pools = self._pools[key] = [shape.pool] if shape.pool else state.index.pools(shape.gpu_model)
        return pools

    def pinned(self, shape: Shape, pool: str) -> Shape:
        """`shape` pinned to `pool` (one object per pair and cycle: these are compared and hashed a lot)."""
        found = self._pinned.get((shape, pool))
        if found is None:
            found = self._pinned[(shape, pool)] = shape if shape.pool == pool else replace(shape, pool=pool)
        return found

    def victims(self, state: SchedulingState) -> Iterator[RunningJob]:
        """Preemptible running jobs in victim-cost order, sorted once per context (costs fixed at `cost_at`).
        Jobs placed under this context are not among them: stopping what was just started would only waste the
        launch (and a job the cycle's order put first is not undone by one it put later)."""
        if self._victims is None:
            self._victims = sorted(
                (
                    (victim_cost(r, self.cost_at), r)
                    for r in state.running.values()
                    if r.preemptible and r.id not in self.fresh
                ),
                key=lambda item: item[0],
            )
        return map(_job, self._victims)  # lazy (compiled, a generator expression would be built as a list)

    def victims_of(self, state: SchedulingState, teams: Collection[str]) -> Iterator[RunningJob]:
        """`victims`, only those of `teams`, in the same order: under quotas a plan may only take from the
        preemptor's team and the teams it reclaims from, and scanning every running job for each of a thousand
        teams' plans made the scan most of a contended cycle. Costs are taken for every victim at once (at the
        moment `victims` would), but each team's list is sorted only when a plan first asks for it: a cycle asks
        for a few of a thousand teams, and sorting every victim was most of its plans' time. A cost ends with the
        job's id, so the merged lists are in exactly the order `victims` gives."""
        by_team = self._by_team
        if by_team is None:
            by_team = self._by_team = {}
            fresh, at = self.fresh, self.cost_at
            for r in state.running.values():
                if r.preemptible and r.id not in fresh:
                    found = by_team.get(r.team)
                    if found is None:
                        found = by_team[r.team] = []
                    found.append((victim_cost(r, at), r))
        lists = []
        for team in teams:
            found = by_team.get(team)
            if not found:
                continue
            if team not in self._sorted_teams:
                found.sort(key=_cost)
                self._sorted_teams.add(team)
            lists.append(found)
        if len(lists) == 1:
            return map(_job, lists[0])
        return map(_job, heapq.merge(*lists, key=_cost))

    def release_order(self, state: SchedulingState) -> list[Release]:
        """Running jobs by expected end (see `backfill.release_order`), once per context: jobs placed under it since
        are not in it (they would end last anyway; a later full cycle sees them)."""
        if self._releases is None:
            self._releases = release_order(state.running.values(), self.cost_at)
        return self._releases

    def stopping_jobs(self, state: SchedulingState, team: str, pool: str) -> list[RunningJob]:
        """The jobs of `team` in `pool` that are stopping, whose quota comes back soon; not those being moved
        (`returning`): they start again at once, their quota with them."""
        if self._stopping is None:
            self._stopping = {}
            for r in state.running.values():
                if r.stopping and not returning(state, r):
                    self._stopping.setdefault((r.team, r.pool), []).append(r)
        return self._stopping.get((team, pool), [])

    def stopped(self, job: RunningJob, *, moved: bool = False) -> None:
        """A job this context asked to stop (`moved`: to start again at once elsewhere, see `returning`)."""
        if self._stopping is not None and not moved:
            self._stopping.setdefault((job.team, job.pool), []).append(job)

    def more_free(self) -> None:
        """GPUs became free within the context (a reservation given up with some of its held GPUs unused): what
        was concluded from their absence (shapes that do not fit, failed plans) no longer holds; the next decisions
        find out again."""
        self.blocked.clear()
        self.unfit.clear()
        self.consolidation_failed.clear()
        self.preempt_failed.clear()

    def may_backfill(self, ends: float | None, shapes: Iterable[Shape]) -> bool:
        """Some reservation holding free GPUs starts no earlier than `ends` (a job ending then could backfill; None:
        at any known start), and one of `shapes` was not found unable to fit on its GPUs (`unfit`)."""
        pairs = zip(self.reservations, self.held, strict=True)
        return any(
            held and res.start is not None and (ends is None or ends <= res.start)
            and any((res.job_id, s) not in self.unfit for s in shapes)
            for res, held in pairs
        )  # fmt: skip

    @property
    def reserved_free(self) -> bool:
        """Some reservation holds GPUs that are free now."""
        return any(self.held)

    def hold_reservation(self, res: Reservation, index: FleetIndex) -> None:
        held: dict[str, list[int]] = {}
        for ref in res.gpus:
            node = index.nodes.get(ref.node)
            if node is not None and ref.index in node.free:
                held.setdefault(ref.node, []).append(ref.index)
        for node_name, indices in held.items():
            index.take(node_name, indices)
        self.reservations.append(res)
        self.held.append(held)

    def release_reservation(self, index: FleetIndex, cordoned: Container[str] = ()) -> None:
        """Give the held GPUs back to the index, except those cordoned since they were held."""
        for held in self.held:
            for node_name, indices in held.items():
                back = [i for i in indices if f"{node_name}/{i}" not in cordoned] if cordoned else indices
                if back:
                    index.give(node_name, back)
        self.held = []
        self.reservations = []


@dataclass
class _Held:
    """A first-pass head set aside for the second because it could start by borrowing now, though its team's
    guarantee admits it in another pool (`_Cycle._room_gone`; an arrival likewise, `_Cycle.arrivals_room_gone`)."""

    entry: Entry
    """Its item in the walk (empty for an arrival)."""
    job: PendingJob
    turn: Turn | None
    options: list[Option]
    number: int = 0
    """Its place among the heads set aside (`_SetAside.hold`)."""


@dataclass
class _SetAside:
    """The `_Held` heads of a first pass (or of a batch of arrivals), by the shapes they would borrow with, and the
    GPUs free and the quota usage (`QuotaUsage.changes`) when they were last known to have room."""

    heads: dict[int, _Held] = field(default_factory=dict)
    by_shape: dict[Shape, list[_Held]] = field(default_factory=dict)
    by_lender: dict[tuple[str, str], list[_Held]] = field(default_factory=dict)
    """(team, pool) -> the heads of the team that would borrow in the pool, the largest first: the cohort stops
    lending for the largest first, so a look at the others ends at the first it still lends for."""
    free: int = 0
    changes: int = 0
    pool_changes: dict[str, int] = field(default_factory=dict)
    count: int = 0

    def hold(self, held: _Held, state: SchedulingState) -> None:
        """Keep `held`, found with room to borrow now. With others kept, `free` and `changes` stay: GPUs and
        lending taken since they were last looked at are still to be looked at (`_Cycle._room_gone`)."""
        if not held.number:
            self.count += 1
            held.number = self.count
        if not self.heads:
            self.free = state.index.free_total()
            self.changes = state.usage.changes
            self.pool_changes = dict(state.usage.pool_changes)
        self.heads[id(held)] = held
        for option in held.options:
            if option.borrowing:
                self.by_shape.setdefault(option.shape, []).append(held)
                if option.shape.pool is not None:
                    there = self.by_lender.setdefault((held.job.team, option.shape.pool), [])
                    bisect.insort(there, held, key=lambda h: -h.job.shape.gpus)

    def may_have_lost_room(self, state: SchedulingState) -> bool:
        """Whether GPUs or lending were taken since the heads were last looked at (`without_room`)."""
        return bool(self.heads) and (state.index.free_total() < self.free or state.usage.changes != self.changes)

    def without_room(self, cycle: "_Cycle") -> list[_Held]:
        """The heads none of whose shapes finds GPUs to borrow on any more, or whose cohort no longer lends for
        them there, and that could not backfill by borrowing either (the shapes are looked at, then only the heads
        of those that lost their room, and those that would borrow in a pool whose quota usage changed), in the
        order they were set aside; `free` and `changes` are marked now."""
        state, ctx, usage = cycle.state, cycle.ctx, cycle.state.usage
        self.free = state.index.free_total()
        changed: set[str | None] = set()
        if usage.changes != self.changes:
            changed = {pool for pool, n in usage.pool_changes.items() if self.pool_changes.get(pool) != n}
            self.changes, self.pool_changes = usage.changes, dict(usage.pool_changes)
        fits: dict[Shape, bool] = {}
        lost = [shape for shape in self.by_shape if not cycle.may_borrow_in(shape, fits)]
        found = {id(held): held for shape in lost for held in self.by_shape[shape]}
        unlent: set[tuple[int, str]] = set()
        """(head, pool): its cohort no longer lends for it there."""
        if changed:
            for (_, pool), there in self.by_lender.items():
                if pool in changed:
                    for held in there:
                        if cycle.lends(held.job, pool):
                            break  # and for every smaller head of the team there
                        unlent.add((id(held), pool))
                        found[id(held)] = held
        out = []
        for held in sorted(found.values(), key=lambda h: h.number):
            shapes = [o.shape for o in held.options if o.borrowing and (id(held), o.shape.pool) not in unlent]
            if any(fits.get(shape, True) for shape in shapes) or (
                held.job.estimate is not None and ctx.may_backfill(ctx.now + held.job.estimate, shapes)
            ):
                continue
            out.append(held)
        return out

    def drop(self, held: _Held) -> None:
        del self.heads[id(held)]
        for option in held.options:
            if option.borrowing:
                _without(self.by_shape, option.shape, held)
                if option.shape.pool is not None:
                    _without(self.by_lender, (held.job.team, option.shape.pool), held)


def _without(lists: dict[Any, list[_Held]], key: Any, held: _Held) -> None:
    left = [h for h in lists[key] if h is not held]
    if left:
        lists[key] = left
    else:
        del lists[key]


@dataclass
class Tail:
    """The rest of a lane closed while room might still be opened for its shape after the walk
    (`_Cycle._shape_hopeless`): each of its heads, found hopeless at its turn, would have joined `to_consolidate`
    if its shape's pools had as many GPUs free as it asks for then (`_Cycle._hopeless`). Free GPUs only get fewer
    within the walk, so the heads whose turns come before the walk's `cutoff` (see `Turn`) are listed, and no
    later one."""

    items: list[Entry]
    shapes: list[Shape]
    """The lane's shape pinned to each pool it may use."""
    cutoff: Entry | None = None
    """The greatest item the pass had taken when too few GPUs were left free for the shape (None: not yet)."""

    def kept(self) -> Iterator[tuple[Turn, None]]:
        for item in self.items:
            if self.cutoff is not None and not item < self.cutoff:
                return
            yield (1, item), None


def run_cycle(state: SchedulingState, now: float) -> list[Decision]:
    state.invalidate()
    if state.config.max_wait_s is not None:
        state.queue.age(now, state.config.max_wait_s)
    ctx = state.ctx = CycleContext(now, cost_at=now, seq=state.queue.seq)
    return _Cycle(state, ctx).run()


def decide_arrivals(state: SchedulingState, ctx: CycleContext, arrived: Iterable[str], now: float) -> list[Decision]:
    """Decide about jobs that arrived since the last cycle, against what it concluded. Under quotas in two passes,
    as the cycle's: first the arrivals their team's guarantee admits, then those only borrowing admits (which wait
    when the cycle's first pass was cut short: heads it never reached may be owed the GPUs)."""
    ctx.now = now
    cycle = _Cycle(state, ctx)
    decisions: list[Decision] = []
    queue = state.queue
    may_borrow = ctx.borrowing
    ctx.borrowing = not state.quota_on  # two passes over the arrivals too: guaranteed ones before borrowers
    set_aside: set[str] = set()
    later: list[PendingJob] = []  # borrowers, and arrivals queued behind one: the second pass's, in arrival order
    held = _SetAside()  # those of them a guarantee admits elsewhere (`_Cycle.arrivals_room_gone`)
    try:
        for job_id in arrived:
            if held.heads:
                cycle.arrivals_room_gone(held, set_aside, later, decisions)
            job = queue.jobs.get(job_id)
            if job is None:
                continue
            if not queue.is_head(job):
                head = queue.head(queue.key_of(job))
                if head is not None and head.id in set_aside:
                    later.append(job)
                else:
                    decisions.append(Wait(job.id, QUEUED))
                continue
            if cycle.consider(job, decisions) == "borrower":
                set_aside.add(job.id)
                later.append(job)
                cycle.keep_set_aside(held, (), job, None)
    finally:
        ctx.borrowing = may_borrow
    for job in later:
        if queue.jobs.get(job.id) is not job:
            continue  # placed (or nominated) since
        if not queue.is_head(job):
            decisions.append(Wait(job.id, QUEUED))
        elif not may_borrow:
            decisions.append(Wait(job.id, BORROW_LATER))
        else:
            cycle.consider(job, decisions)
    cycle.consolidate(decisions)
    return decisions


QUEUED = Reason(WaitKind.QUEUED, "queued behind earlier jobs of the same priority, team and shape")
BORROW_LATER = Reason(WaitKind.QUOTA, "waiting: it would start by borrowing, decided after the queue's guaranteed jobs")


class _Cycle:
    def __init__(self, state: SchedulingState, ctx: CycleContext) -> None:
        self.state = state
        self.ctx = ctx
        self.config = state.config
        self.turn: Turn | None = None
        """The walk's turn (None outside a walk)."""
        self._watching: list[Tail] = []
        """Tails of this pass whose cutoff is not known yet."""
        self._free_seen = -1
        self._tail_refused: dict[tuple[str, str, bool], int] = {}
        """(team, pool, preemptible) -> the fewest GPUs its quota refused a closed lane's head in `consolidate`."""
        self._room_options: list[Option] | None = None
        """Set by `consider` when it sets a job aside that a guarantee admits elsewhere (`_may_borrow_now`): the
        options it had, taken by `keep_set_aside`."""

    def run(self) -> list[Decision]:
        state, ctx = self.state, self.ctx
        decisions: list[Decision] = []
        self._interrupt(decisions)
        self._place_nominated(decisions)
        ctx.lowest_victim = min(
            (r.priority for r in state.running.values() if r.preemptible and not r.stopping), default=None
        )
        ctx.reclaimable = state.quota_on and any(r.borrowed and not r.stopping for r in state.running.values())
        if ctx.reclaimable and self.config.reclaim_past_guarantee:
            ctx.smallest_waiting(state)  # as the queue is when the cycle starts, whichever head asks first
        queue = state.queue
        standing = state.standing
        if not state.quota_on:
            queue.wake_all()
        # Sub-queue heads, and parked groups (looked at in their turn, and woken only if admitted then).
        # Two passes under quotas (as Kueue orders its heads): first every job its team's guarantee admits, then
        # the ones that would borrow, so a borrower never takes in a cycle what a guaranteed job needs in it.
        ctx.borrowing = not state.quota_on
        items = queue.heads(standing)
        lanes: dict[Lane, list[Entry]] = {}
        if state.quota_on and not (self.config.strict_fifo or self.config.strict_fifo_per_team):
            items, lanes = self._split_by_guarantee(items)
        first = Walk(queue, items)
        deferred = self._walk(first, decisions)
        # The second pass, and the arrivals decided against this context after it, may borrow: unless the first
        # pass was cut short by the test budget, leaving guaranteed heads undecided until the next cycle.
        ctx.borrowing = ctx.tests < self.config.max_tests_per_cycle or first.pop() is None
        if (deferred or lanes) and ctx.borrowing:
            self._walk(Walk(queue, [], deferred, lanes), decisions)
        self.consolidate(decisions)
        sticky = self.config.sticky_reservations
        if sticky != "none":
            queue.reserved = {
                r.job_id: r.gpus for r in ctx.reservations if sticky == "all" or _aged(queue.jobs.get(r.job_id))
            }
        return decisions

    def _walk(self, heads: Walk, decisions: list[Decision]) -> list[Entry]:
        """Walk sub-queue heads in queue order; returns the heads set aside because they would borrow."""
        state, ctx, queue = self.state, self.ctx, self.state.queue
        standing = state.standing
        deferred: list[Entry] = []
        seq = ctx.seq
        passing = 1 if ctx.borrowing else 0
        # Parked groups wake one sub-queue at a time (`_wake_in_turn`), except in a strict order: there a head
        # refused at its turn ends the walk or its team's turn, so every head the cohort lent for when its group
        # came up has its turn (found by review: waking one at a time let the walk go on past such a head).
        lazy = not (self.config.strict_fifo or self.config.strict_fifo_per_team)
        mark: Entry | None = None
        set_aside = _SetAside()
        while ctx.tests < self.config.max_tests_per_cycle:
            if set_aside.heads:  # before the next item is taken: the set-aside heads' turns came before it
                self._room_gone(set_aside, deferred, heads, decisions)
                if ctx.tests >= self.config.max_tests_per_cycle:
                    break  # (found by review: the head decided here took the last look, and the walk took one more)
            if (popped := heads.pop()) is None:
                break
            item = popped[-1]
            if item.__class__ is Parking:
                item = item.group  # a parked group's item in the kept order (see `queue.Entry`)
            if self._watching and mark is not None:
                self._watch(mark)
            if mark is None or mark < popped:
                mark = popped
            self.turn = (passing, mark)
            if not isinstance(item, SubQueue):
                if ctx.borrowing and lazy and (room := self._borrower_only(item)) is not None:
                    self._wake_in_turn(item, room, popped, heads)  # the common case with a thousand teams
                    continue
                woken, borrowers = self._wake(item)
                if not woken and heads.lane is not None and state.usage.borrowable(item[0], item[1]) <= 0:
                    heads.close(heads.lane)  # its cohort lends nothing more this cycle: no group of it wakes
                for sq in woken:
                    head = queue.head_of(sq)
                    if head is not None:
                        heads.push(entry(queue.order_of(head, standing), WOKEN, next(seq), sq))
                first = queue.first_order(item, standing) if borrowers else None  # cached while unchanged
                if first is not None:  # the group again in the second pass, no later than its first head's turn
                    deferred.append(entry(first, WOKEN, next(seq), item))
                continue
            sq = item
            job = queue.head_of(sq)
            if job is None:
                continue
            ctx.tests += 1
            if job.team in ctx.blocked_teams:
                continue
            if self._exhausted(job):
                decisions.append(Wait(job.id, self._capacity_reason(job)))
                self._new_heads_exhausted(heads, decisions)
                break
            if self._hopeless(job):
                if isinstance(heads.lane, Shape) and (verdict := self._shape_hopeless(heads.lane)):
                    self._close_lane(heads, verdict)  # no later sub-queue of its lane could do anything either
                continue  # its sub-queue stays as it was: nothing this cycle could do for it
            outcome = "borrower" if not ctx.borrowing and self._only_borrows(job) else self.consider(job, decisions)
            if outcome == "borrower":
                deferred.append(popped)
                ctx.tests -= 1  # only set aside: it is decided, and counted, in the second pass
                if lazy:
                    self.keep_set_aside(set_aside, popped, job, self.turn)
                continue
            if isinstance(heads.lane, Shape) and self._no_room_left(heads.lane):
                self._close_lane(heads, "close")
            if outcome in ("blocked", "reserved", "refused"):
                if self.config.strict_fifo:
                    break
                if self.config.strict_fifo_per_team:
                    ctx.blocked_teams.add(job.team)
                    continue
            self._after(outcome, popped, heads, decisions)
        if self._watching:
            ended = ctx.tests < self.config.max_tests_per_cycle and heads.pop() is None
            for tail in self._watching:  # heads after the walk's last item: their turns came at its end, or never
                if not (ended and self._room_for(tail.shapes)) and mark is not None:
                    tail.cutoff = mark
            self._watching = []
        return deferred

    def _after(self, outcome: str, popped: Entry, heads: Walk, decisions: list[Decision]) -> None:
        """What the walk does after the head of the sub-queue `popped` stands for was decided (not set aside):
        look ahead behind a head left waiting, or take the sub-queue's next head at its turn."""
        ctx, queue = self.ctx, self.state.queue
        kind, number, sq = popped[-3:]
        if outcome in ("blocked", "reserved", "refused"):
            if outcome == "reserved":
                ctx.tests += self._reserve_behind(sq.key, decisions)
            if outcome != "refused":  # behind a refused head every job is refused too: no look-ahead
                ctx.tests += self._backfill_behind(sq.key, decisions)
            return
        nxt = queue.head_of(sq)
        if nxt is not None:
            heads.push(entry(queue.order_of(nxt, self.state.standing), kind, number, sq))

    def _room_gone(self, set_aside: "_SetAside", deferred: list[Entry], heads: Walk, decisions: list[Decision]) -> None:
        """In the first pass, once GPUs were taken: a head set aside because it could start by borrowing now,
        though a guarantee admits it elsewhere (`consider`), whose room to borrow is gone (a guaranteed job later
        in the queue took it) is decided in full at once, at its own turn, as it would have been had the room not
        been there: before a later job of its team takes the guarantee it would fall back on. Left for the second
        pass, it found its team's lower-priority job holding that guarantee. A head that could still backfill by
        borrowing (into the reservation that took its room, say) stays set aside: the second pass may place it so.
        The room is gone when the GPUs to borrow on are, or the lending: a later guaranteed job that takes what
        the cohort lent (its idle guarantee), or reclaims it by preempting (a nomination counts in the usage),
        leaves the GPUs free and the job without room all the same (`test_first_pass_borrowing.py`). When only GPUs
        were taken the shapes are looked at, not each head, so a round costs the shapes that lost their room and
        their heads; once the quota usage changed, every head's lending is looked at too."""
        ctx, queue = self.ctx, self.state.queue
        budget = self.config.max_tests_per_cycle
        while set_aside.may_have_lost_room(self.state):  # a decision here may take more
            for held in set_aside.without_room(self):
                if ctx.tests >= budget:
                    return  # the walk ends here too: the rest wait for the next cycle, set aside as they are
                set_aside.drop(held)
                sq = held.entry[-1]
                assert isinstance(sq, SubQueue)
                if queue.head_of(sq) is not held.job:
                    continue  # decided since
                deferred.remove(held.entry)
                self._decide_held(held, set_aside, deferred, heads, decisions)

    def _decide_held(
        self, held: "_Held", set_aside: "_SetAside", deferred: list[Entry], heads: Walk, decisions: list[Decision]
    ) -> None:
        """Decide in full, at its own turn, a head `_room_gone` found without room to borrow."""
        ctx = self.ctx
        turn, self.turn = self.turn, held.turn
        waiting = len(ctx.to_consolidate)
        ctx.tests += 1
        try:
            outcome = self.consider(held.job, decisions)
            if outcome != "borrower":
                self._after(outcome, held.entry, heads, decisions)
        finally:
            self.turn = turn
            added = ctx.to_consolidate[waiting:]
            del ctx.to_consolidate[waiting:]
            for late in added:  # `consolidate` takes them in turn order
                bisect.insort(ctx.to_consolidate, late, key=_turn)
        if outcome == "borrower":  # set aside again (its team's guarantee no longer admits it either)
            deferred.append(held.entry)
            ctx.tests -= 1
            self.keep_set_aside(set_aside, held.entry, held.job, held.turn, held.number)

    def arrivals_room_gone(
        self, set_aside: "_SetAside", borrowers: set[str], later: list[PendingJob], decisions: list[Decision]
    ) -> None:
        """`_room_gone` for arrivals (`decide_arrivals`, in arrival order, before the next arrival is decided): an
        arrival set aside to borrow whose GPUs to borrow on are gone, and that could not backfill by borrowing
        either, is decided in full now, before a later arrival of its team takes the guarantee it would fall back
        on. One set aside again keeps its place among the later ones."""
        while set_aside.may_have_lost_room(self.state):  # a decision here may take more
            for held in set_aside.without_room(self):
                set_aside.drop(held)
                job = held.job
                if self.state.queue.jobs.get(job.id) is not job:
                    continue  # decided since
                if self.consider(job, decisions) == "borrower":  # its team's guarantee no longer admits it either
                    self.keep_set_aside(set_aside, held.entry, job, None, held.number)
                    continue
                borrowers.discard(job.id)
                later.remove(job)

    def keep_set_aside(
        self, set_aside: "_SetAside", item: Entry, job: PendingJob, turn: Turn | None, number: int = 0
    ) -> None:
        """After `consider` set `job` aside: keep it in `set_aside` if a guarantee admits it elsewhere (it had room
        to borrow, `_room_options`), to be looked at again when that room goes."""
        options, self._room_options = self._room_options, None
        if options is not None:
            set_aside.hold(_Held(item, job, turn, options, number), self.state)

    def lends(self, job: PendingJob, pool: str) -> bool:
        """Whether the job's cohort still lends it what it asks for in `pool` (where it would borrow)."""
        book = self.state.quota
        if book is None:
            return True
        return admits(book, self.state.usage, job.team, pool, job.shape.gpus, preemptible=job.preemptible)[0]

    def may_borrow_in(self, shape: Shape, fits: dict[Shape, bool]) -> bool:
        """`_may_borrow_now` for one borrowing option's shape, remembered in `fits` for one look at the GPUs."""
        found = fits.get(shape)
        if found is None:
            found = fits[shape] = shape not in self.ctx.blocked and find_placement(self.state.index, shape) is not None
            if not found:
                self.ctx.blocked.add(shape)
        return found

    # ---- shortcuts that keep a cycle O(sub-queues that can move) ---------------------------------------------

    def _split_by_guarantee(self, items: list[Entry]) -> tuple[list[Entry], dict[Lane, list[Entry]]]:
        """The walk's items split by guarantee before the first pass (see `split`)."""
        return Split(self.state, self.ctx, self.config.reclaim_past_guarantee).run(items)

    def _shape_hopeless(self, shape: Shape) -> Literal["", "close", "consolidate"]:
        """In the second pass, a head of `shape` from its lane was just found hopeless (`_hopeless`): whether every
        later head of the lane would be too ("": not known). They are of teams that may start them only on free
        GPUs, by backfill, or on room opened after the walk (the lane's teams neither displace nor reclaim, see
        `_split_by_guarantee`; they stay such for the cycle, see `_close_lane`). That the
        head was found hopeless says its shape is blocked in every pool it may use and no reservation is left to
        make; within the walk both stay so, and free GPUs, held ones and reservations to backfill into only get
        fewer. What was particular to the head is left aside: its estimate (so no reservation may hold GPUs
        that a job of any estimate could backfill onto), and a refusal of its team's kind remembered in the cycle
        (a sub-queue it would have parked stays in the walk for the next cycle; parking changes no decision).

        "consolidate": room might still be opened for the shape after the walk, so each later head would join
        `to_consolidate` at its turn while the shape's pools still have as many GPUs free as it asks for; the
        lane's rest is handed to `consolidate` instead (a `Tail`), which takes each such head at its turn. On a
        fragmented full fleet most of the second pass's heads are such gangs."""
        ctx, config = self.ctx, self.config
        shapes = self._pinned_shapes(shape)
        if ctx.may_backfill(None, shapes):
            return ""
        if config.consolidate and shape.gpus > 1 and any(self._may_consolidate(s) for s in shapes):
            return "consolidate"
        return "close"

    def _no_room_left(self, shape: Shape) -> bool:
        """In the second pass, after a head of `shape` from its lane was decided: whether no later head of the lane
        could start in the cycle whatever its quota says, because its pools have fewer GPUs free than it asks for,
        no reservation is left to make, and none holds GPUs a job of any estimate could backfill onto (the lane's
        teams neither displace nor reclaim, see `_shape_hopeless`). Under quotas a head is often refused before
        its placement is tried, so on a full fleet its shape was never found blocked, and each of the second
        pass's heads of it was looked at in full only to be refused. Not for gangs where room may be opened: one
        looked at in full joins `to_consolidate` whatever is free (room may be freed for it after the walk, by a
        reservation given up there), and which later heads would have, only the walk itself can tell (found by
        review: the first one its quota admits blocks the shape, and no later one joins)."""
        ctx, index = self.ctx, self.state.index
        if len(ctx.reservations) < self.config.max_reservations or (self.config.consolidate and shape.gpus > 1):
            return False
        shapes = self._pinned_shapes(shape)
        if any(index.free_in(index.partitions_for(s)) >= s.gpus for s in shapes):
            return False
        return not ctx.may_backfill(None, shapes)

    def _room_for(self, shapes: list[Shape]) -> bool:
        index = self.state.index
        return any(index.free_in(index.partitions_for(s)) >= s.gpus for s in shapes)

    def _watch(self, mark: Entry) -> None:
        """Before the walk's next item: a tail whose shape has fewer GPUs free than it asks for from now on gets its
        cutoff (`mark`, the greatest item taken so far). Looked at only when the free GPUs changed."""
        free = self.state.index.free_total()
        if free == self._free_seen:
            return
        self._free_seen = free
        still = []
        for tail in self._watching:
            if self._room_for(tail.shapes):
                still.append(tail)
            else:
                tail.cutoff = mark
        self._watching = still

    def _close_lane(self, heads: Walk, verdict: str) -> None:
        """Close the lane the walk's last item came from, handing its rest to `consolidate` when `verdict` is
        "consolidate" (see `_shape_hopeless` and `Tail`). A lane's team stays one that can only borrow for the
        whole cycle: the first pass does not borrow, and where such a team is at its guarantee, it gives the team
        only work above the team's lowest preemptible work there (by displacing it), so above the lane's heads:
        no later head of the lane gains work of its own team to displace."""
        lane = heads.lane
        assert isinstance(lane, Shape)
        rest = heads.rest()
        heads.close(lane)
        if verdict == "consolidate" and rest:
            tail = Tail(rest, self._pinned_shapes(lane))
            self.ctx.consolidation_tails.append(tail)
            self._watching.append(tail)
            self._free_seen = -1

    def _wake(self, group: ParkGroup) -> tuple[list[SubQueue], bool]:
        """A parked group's turn: wake the sub-queues whose heads its team's quota admits now. In the first pass
        only those admitted without borrowing (within the guarantee, by displacing the team's own lower-priority
        work, or by reclaiming past the guarantee) wake. If the smallest of the rest is admitted by borrowing, True
        is returned with them (they stay parked): the group has its turn again in the second pass no later than the
        first of their heads would (`_walk`). The borrowers placed before it there usually took what the cohort
        had to lend; waking each one to set it aside and park it again cost most of a cycle with a thousand teams
        at their quota. Usage only grows within a cycle, so a head not admitted when the group has its turn would
        not be admitted in its own turn either.

        The largest admitted request is found by bisection with the admission check itself, which only gets
        harder with more GPUs; for a team at or above its guarantee with no lower-priority work of its own to
        displace (most teams, when a thousand wait at their quota), it is simply what the cohort can lend
        (`_borrower_only`)."""
        queue = self.state.queue
        parking = queue.parked.get(group)
        if parking is None:
            return [], False  # woken whole since
        borrower = self._borrower_only(group)
        if borrower is not None:  # the common case with a thousand teams at their quota, answered at once
            if self.ctx.borrowing:  # (only in a strict order: else such a group is `_wake_in_turn`'s)
                top = min(parking.subqueues[-1][0], borrower)
                return (queue.wake(group, top) if top >= parking.min_gpus else []), False
            return [], parking.min_gpus <= borrower
        if self.ctx.borrowing:
            top = self._largest(group, parking, borrowing=True)
            return (queue.wake(group, top) if top else []), False
        direct = self._largest(group, parking, borrowing=False)
        if not direct:  # its smallest head is neither within the guarantee, nor displaces, nor reclaims past it
            team, pool, preemptible, _ = group
            book = self.state.quota
            assert book is not None
            return [], admits(book, self.state.usage, team, pool, parking.min_gpus, preemptible=preemptible)[0]
        woken = queue.wake(group, direct)
        parking = queue.parked.get(group)
        if parking is None or not self._admitted(group, parking.min_gpus, borrowing=True):
            return woken, False
        return woken, True

    def _wake_in_turn(self, group: ParkGroup, room: int, popped: Entry, heads: Walk) -> None:
        """A parked group's turn in the second pass, its team one that may only borrow (`_borrower_only`, `room`
        GPUs): wake the one sub-queue whose head comes first in queue order among those the quota admits now, if
        that head's turn is now, and have the group's turn come again at the next such head's; if it is later,
        the group's turn moves there. Heads before the turn were decided in this cycle already (one refused since
        parks into the group again, and stays refused: usage only grows within a cycle).

        Waking every admitted sub-queue at once (as `_wake` does) was most of the second pass with a thousand
        teams at their quota: the cohort lent a few GPUs, the first woken head borrowed them, and every other one
        was looked at in full only to be refused and parked again, in every cycle. Woken one by one at its turn,
        each head finds what is left to lend then, which is what it would have found at its own turn anyway: the
        same decisions (`tests/unit/scheduler/test_wake_in_turn.py`). Not in a strict order (see `_walk`)."""
        queue, standing, seq = self.state.queue, self.state.standing, self.ctx.seq
        parking = queue.parked.get(group)
        if parking is None:
            return  # woken whole since
        turn = popped[:-3]
        top = min(parking.subqueues[-1][0], room)
        first: tuple[Order, SubQueue] | None = None
        then: Order | None = None
        for gpus, _, sq in parking.subqueues:
            if gpus > top:
                break
            head = queue.head_of(sq)
            if head is None:
                continue
            order = queue.order_of(head, standing)
            if order < turn:
                continue
            if first is None or order < first[0]:
                if first is not None:
                    then = first[0]  # the earlier first comes next
                first = (order, sq)
            elif then is None or order < then:
                then = order
        if first is None:
            if heads.lane is not None and self.state.usage.borrowable(group[0], group[1]) <= 0:
                heads.close(heads.lane)  # its cohort lends nothing more this cycle: no group of it wakes
            return
        if first[0] == turn:
            queue.wake_one(group, first[1])
            heads.push(entry(turn, WOKEN, next(seq), first[1]))
        else:
            then = first[0]
        if then is not None:
            heads.push(entry(then, WOKEN, next(seq), group))

    def _largest(self, group: ParkGroup, parking: Parking, *, borrowing: bool) -> int:
        """The most GPUs the group's quota admits a head of now (0: not even its smallest head)."""
        low, high = parking.min_gpus, parking.subqueues[-1][0]
        if not self._admitted(group, low, borrowing=borrowing):
            return 0
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self._admitted(group, mid, borrowing=borrowing) else (low, mid - 1)
        return low

    def _admitted(self, group: ParkGroup, gpus: int, *, borrowing: bool) -> bool:
        team, pool, preemptible, priority = group
        state = self.state
        book = state.quota
        assert book is not None
        ok, borrows = admits(book, state.usage, team, pool, gpus, preemptible=preemptible)
        return (
            (ok and (borrowing or not borrows))
            or displacement(state, team, pool, gpus=gpus, priority=priority, preemptible=preemptible) is not None
            or self._may_pass(team, gpus, reclaim_past(book, state.usage, team, pool, gpus, preemptible=preemptible))
        )

    def _borrower_only(self, group: ParkGroup) -> int | None:
        """When the team is at or above its guarantee in the pool and runs no lower-priority preemptible work
        there, the most GPUs a head of the group is admitted for now (0: none), which is then by borrowing alone:
        `_admitted` for every size at once, without bisection (its displacement and reclaim-past checks cannot
        pass for such a team). None otherwise (the group needs `_admitted`'s full checks)."""
        team, pool, preemptible, priority = group
        state = self.state
        book = state.quota
        assert book is not None
        q = book.quota(team, pool)
        used = state.usage.used_in(team, pool)
        if used < q.nominal or state.preemptible_below(team, pool, priority) > 0:
            return None
        if not preemptible:
            return 0
        room = state.usage.borrowable(team, pool)
        if q.borrowing_limit is not None:
            room = min(room, q.nominal + q.borrowing_limit - used)
        return max(0, room)

    def _may_pass(self, team: str, gpus: int, past: int) -> bool:
        """May a job of `gpus` that takes `team` `past` GPUs beyond its guarantee (`reclaim_past`) reclaim for it:
        some team borrows, and no job of the team asks for fewer GPUs (the one that ends its shortfall soonest;
        a wider one would take more than the team is short of)."""
        ctx = self.ctx
        if past <= 0 or not ctx.reclaimable or not self.config.reclaim_past_guarantee:
            return False
        return gpus <= ctx.smallest_waiting(self.state).get(team, gpus)

    def _only_borrows(self, job: PendingJob) -> bool:
        """Quickly, in the first pass: every pool the job may use admits it only by borrowing, so `consider` would
        set it aside for the second pass (decided before the questions `consider` asks first answer otherwise).
        A sufficient test: False sends the job through `consider`, which decides in full."""
        state, ctx = self.state, self.ctx
        book = state.quota
        if book is None or not job.preemptible:
            return False
        pools = ctx.pools_of(state, job.shape)
        if not pools or budget_refusal(state, job) or self._unschedulable(job):
            return False
        kind = (job.team, job.shape.pool, job.shape.gpu_model, job.preemptible, job.priority)
        known = ctx.refused.get(kind)
        if known is not None and job.shape.gpus >= known[0]:
            return False
        usage, gpus = state.usage, job.shape.gpus
        return all(admits(book, usage, job.team, p, gpus, preemptible=True) == (True, True) for p in pools)

    def _exhausted(self, job: PendingJob) -> bool:
        """Nothing free, nothing reserved, nobody this job (or anyone after it) may preempt: stop looking."""
        ctx = self.ctx
        if self.state.index.free_total() or ctx.reserved_free:
            return False
        if not self.config.preemption:
            return True
        if ctx.reclaimable:
            return False
        return ctx.lowest_victim is None or job.priority <= ctx.lowest_victim

    def _new_heads_exhausted(self, heads: Walk, decisions: list[Decision]) -> None:
        """The walk stops at a head `_exhausted` finds nothing for, and so would each head after it, at its turn.
        The heads that came up in this walk (the next job of a sub-queue whose head started, or a woken sub-queue's)
        and were not reached are told so now, with the reason their turn would have given them. Before, they kept
        the one they got when they arrived ("queued behind earlier jobs of the same priority, team and shape")
        while first in their sub-queue: most heads of a full fleet. A head not reached that was one already when
        the walk began was, in most cases, told in the cycle it became one, or on arrival, and that reason holds
        (the service stores a reason only when its kind or words change; its numbers are rendered on read). A few
        a cycle: as many as started in it."""
        queue, blocked = self.state.queue, self.ctx.blocked_teams
        told: set[SubQueue] = set()
        for item in sorted(heads.pushed()):
            sq = item[-1]
            if sq.__class__ is not SubQueue or sq in told or sq.parked is not None:
                continue
            told.add(sq)
            job = queue.head_of(sq)
            if job is not None and job.team not in blocked and self._exhausted(job):
                decisions.append(Wait(job.id, self._capacity_reason(job)))

    def _hopeless(self, job: PendingJob) -> bool:
        """Already known this cycle: its shape does not fit, it may neither preempt nor backfill, and nothing is
        left to try for it but opening room after the walk (`consolidate`), in which case it joins that list here,
        at its turn, as `consider` would have added it (in the second pass only: in the first, `consider` might
        set it aside for the second, where it would join the list later)."""
        ctx, shape, config = self.ctx, job.shape, self.config
        if len(ctx.reservations) < config.max_reservations:
            return False  # it might be a head to reserve for
        shapes = self._pinned_shapes(shape)
        consolidate = False
        if config.consolidate and shape.gpus > 1:
            if any(r.job_id == job.id for r in ctx.reservations):
                return False  # its own reservation's GPUs are free for it when room is opened (`consolidate`)
            if (config.strict_fifo or config.strict_fifo_per_team) and any(
                s not in ctx.consolidation_failed for s in shapes
            ):
                return False  # "blocked" ends a strict walk (or the team's turn): `consider` says so
            if any(self._may_consolidate(s) for s in shapes):
                if not ctx.borrowing:
                    return False
                consolidate = True  # room might be opened for it by moving small jobs
            if self._may_look_ahead() and ctx.may_backfill(None, shapes):
                return False  # a job behind it might backfill (`_backfill_behind`, after a blocked head)
            known = ctx.refused.get((job.team, shape.pool, shape.gpu_model, job.preemptible, job.priority))
            if known is not None and shape.gpus >= known[0]:
                return False  # its quota refuses it: `consider` parks its sub-queue
        if job.estimate is not None and ctx.may_backfill(ctx.now + job.estimate, shapes):
            return False  # it might backfill
        if not self.state.quota_on:
            hopeless = shape in ctx.blocked and not (
                ctx.lowest_victim is not None
                and job.priority > ctx.lowest_victim
                and job.priority > ctx.preempt_failed.get((shape, ""), NO_PRIORITY)
            )
        else:
            hopeless = all(self._hopeless_in(job, pool) for pool in ctx.pools_of(self.state, shape))
        if hopeless and consolidate:
            ctx.to_consolidate.append((self.turn, job))
        return hopeless

    def _may_consolidate(self, shape: Shape) -> bool:
        """Whether `consolidate` might still open room for `shape` after the walk: no plan failed for it in this
        context, it has no topology requirement, and its pool has as many GPUs free as it asks for (a plan needs
        them, and within a context free GPUs only get fewer; only a job's own reservation is given back to it
        there, which `_hopeless` leaves to `consider`). On a full fleet most blocked gangs fail the last test, and
        each was otherwise looked at in full, in every cycle, only to be added to the list `consolidate` skips."""
        index = self.state.index
        return (
            shape not in self.ctx.consolidation_failed
            and shape.level is None
            and index.free_in(index.partitions_for(shape)) >= shape.gpus
        )

    def _hopeless_in(self, job: PendingJob, pool: str) -> bool:
        """Under quotas: its shape in `pool` does not fit, and it may neither preempt its team's lower-priority
        work there nor reclaim (or it already failed to this cycle)."""
        state, ctx = self.state, self.ctx
        pinned = ctx.pinned(job.shape, pool)
        if pinned not in ctx.blocked:
            return False
        book = state.quota
        assert book is not None
        past = reclaim_past(book, state.usage, job.team, pool, job.shape.gpus, preemptible=job.preemptible)
        if self._may_pass(job.team, job.shape.gpus, past) and job.priority > ctx.preempt_failed.get(
            (pinned, f"{job.team}/past"), NO_PRIORITY
        ):
            return False
        if job.priority <= ctx.preempt_failed.get((pinned, job.team), NO_PRIORITY):
            return True
        if state.preemptible_below(job.team, pool, job.priority) > 0:
            return False
        return not (ctx.reclaimable and may_reclaim(book, state.usage, job.team, pool, job.shape.gpus))

    # ---- one job -------------------------------------------------------------------------------------------

    def consider(self, job: PendingJob, decisions: list[Decision]) -> str:
        """Place, backfill, preempt for, reserve for, or keep waiting one job. Returns what happened to it:
        "placed", "nominated", "reserved", "borrower" (set aside for the second pass), "blocked" (it waits for
        capacity), or "refused" (it may not start now whatever the capacity: unschedulable, its team's budget or
        quota; so may no job behind it in its sub-queue, which asks the same of the same team)."""
        state, ctx = self.state, self.ctx
        self._room_options = None
        missing = self._unschedulable(job)
        if missing:
            decisions.append(Wait(job.id, Reason(WaitKind.UNSCHEDULABLE, f"unschedulable: {missing}")))
            return "refused"
        refusal = budget_refusal(state, job)
        if refusal:
            decisions.append(Wait(job.id, Reason(WaitKind.BUDGET, f"waiting: {refusal}")))
            return "refused"
        kind = (job.team, job.shape.pool, job.shape.gpu_model, job.preemptible, job.priority)
        known = ctx.refused.get(kind)
        if known is not None and job.shape.gpus >= known[0]:
            self._park(job)
            decisions.append(Wait(job.id, known[1]))
            return "refused"
        adm = admissions(state, job, ctx)
        if not ctx.borrowing and adm.options and all(o.borrowing for o in adm.options):
            return "borrower"  # its turn comes after every job its team's guarantee admits
        options = adm.options
        elsewhere = not ctx.borrowing and any(o.borrowing for o in options)
        if elsewhere:
            # The first pass starts a job only where its guarantee admits it: a job that may use several pools,
            # within its team's guarantee in a full one, used to borrow in another here, ahead of the jobs the
            # guarantees of that pool's owners admit (and of higher-priority borrowers).
            options = [o for o in options if not o.borrowing]
        for option in options:
            if option.shape in ctx.blocked:
                continue
            gpus = find_placement(state.index, option.shape)
            if gpus is not None:
                note = "; borrowing idle quota" if option.borrowing else ""
                self._place(job, gpus, _placed_reason(gpus) + note, decisions, borrowing=option.borrowing)
                return "placed"
            ctx.blocked.add(option.shape)
        if options and self._backfill_into_reservation(job, decisions, options):
            return "placed"
        if elsewhere and self._may_borrow_now(adm.options):
            self._room_options = adm.options
            return "borrower"  # borrowing disrupts nobody: second pass, after the guaranteed jobs, if room is left
        if self.config.consolidate and job.shape.gpus > 1:
            ctx.to_consolidate.append((self.turn, job))  # room may be opened for it after the walk (`consolidate`)
        if self.config.preemption:
            for option in adm.options:
                if self._try_preemption(job, decisions, option):
                    return "nominated"
            for option, need in adm.displace:
                if self._try_preemption(job, decisions, option, need):
                    return "nominated"
            for option in adm.reclaim_only:  # the quota refuses it, but reclaiming past the guarantee may not
                if self._may_pass(job.team, job.shape.gpus, option.past) and self._try_preemption(
                    job, decisions, option, refused=True
                ):
                    return "nominated"
        if not adm.options:
            why = Reason(WaitKind.QUOTA, f"waiting: {adm.refusal}")
            if not adm.displace:
                ctx.refused[kind] = (job.shape.gpus, why)
                self._park(job)
            decisions.append(Wait(job.id, why))
            return "refused"
        if len(ctx.reservations) < self.config.max_reservations:
            pinned = replace(job, shape=adm.options[0].shape)
            taken = {g.slot for r in ctx.reservations for g in r.gpus}
            res = self._keep_plan(job, taken) or reserve(state.index, pinned, ctx.release_order(state), ctx.now, taken)
            if res is not None:
                ctx.hold_reservation(res, state.index)
                start_in = None if res.start is None else res.start - ctx.now
                reason = Reason(WaitKind.RESERVED, f"waiting for {job.shape.describe()}; reserved", None, start_in)
                decisions.append(Wait(job.id, reason))
                return "reserved"
        decisions.append(Wait(job.id, self._capacity_reason(job)))
        return "blocked"

    def _may_borrow_now(self, options: list[Option]) -> bool:
        """Whether a pool where the job would borrow has room for it now. If so, the first pass sets the job aside
        for the second; if not, it decides the job in full there (preempting within its guarantee, reserving),
        as a job its guarantee admits: free GPUs only get fewer within a cycle, so the second pass could not have
        let it borrow either, and setting it aside gave its team's lower-priority jobs its guarantee first."""
        fits: dict[Shape, bool] = {}
        return any(self.may_borrow_in(o.shape, fits) for o in options if o.borrowing)

    def _keep_plan(self, job: PendingJob, taken: set[str]) -> Reservation | None:
        """The GPUs the job's reservation planned on in the last cycle, if they are all still free or held by
        running jobs (not cordoned, nominated or counted on by an earlier reservation): a node that has been
        draining for a gang keeps draining for it, instead of the plan moving whenever an estimate changes."""
        state = self.state
        previous = state.queue.reserved.get(job.id) if self.config.sticky_reservations != "none" else None
        if not previous:
            return None
        ends: list[float | None] = []
        holders: set[str] = set()
        for ref in previous:
            slot = ref.slot
            if slot in taken or slot in state.cordoned or slot in state.nominated_slots:
                return None
            holder = state.holder.get(slot)
            if holder is None:
                node = state.index.nodes.get(ref.node)
                if node is None or ref.index not in node.free:
                    return None
            elif holder not in holders:
                holders.add(holder)
                ends.append(_expected_end(state.running[holder], self.ctx.now))
        start = None if None in ends else max([self.ctx.now, *(e for e in ends if e is not None)])
        return Reservation(job.id, start, previous)

    def _park(self, job: PendingJob) -> None:
        """Its team's quota refuses it in the one pool it may use: set its sub-queue aside until that changes."""
        state = self.state
        pools = self.ctx.pools_of(state, job.shape)
        if len(pools) == 1:
            order = state.queue.order_of(job, state.standing)
            state.queue.park(job, (job.team, pools[0], job.preemptible, job.priority), order)

    def _unschedulable(self, job: PendingJob) -> str:
        """What the fleet lacks for this job whatever happens to other jobs; empty when it could run someday."""
        index, shape = self.state.index, job.shape
        parts = index.partitions_for(shape)
        if not parts:
            what = " of ".join(c for c in (shape.gpu_model, shape.pool) if c)
            return f"no nodes with GPUs of {what}" if what else "no nodes with GPUs"
        if shape.level is not None and shape.required:
            return ""  # whether a domain can hold it depends on the topology: reserved or waiting say more
        largest, slots = index.capacity_for(parts, shape.per_replica)
        if shape.per_replica > largest:
            return f"{shape.per_replica} GPUs per replica, but the largest node has {largest}"
        if slots < shape.replicas:
            return f"{shape.describe()} needs more nodes than the fleet has (room for {slots} replicas)"
        return ""

    def _try_preemption(
        self,
        job: PendingJob,
        decisions: list[Decision],
        option: Option,
        need: QuotaNeed | None = None,
        *,
        refused: bool = False,
    ) -> bool:
        """Without quota: any lower-priority preemptible job. With quota: lower-priority jobs of the job's own
        team, and other teams' borrowed jobs only when the job stays within its nominal (reclaim). So teams
        never preempt each other back and forth: only a team within its guarantee takes from a borrower.
        With `need`, only the team's own lower-priority jobs, and they must free that much of its quota.

        Reclaim past the guarantee (`option.past`, when `_may_pass`): a team below its guarantee whose smallest
        waiting job is wider than what is left of it may take, from other teams' jobs of at most its priority,
        as long as each team taken from still borrows at least `past` GPUs afterwards: the preemptor ends no
        further above its guarantee than any of its victims' teams (Kueue's fair-sharing rule, preempt while the
        preemptor's final share is at most the target's, in GPUs beyond the guarantee). Nobody is taken below
        its guarantee, so nobody reclaims back. `refused`: the quota refuses the job as things are (its cohort has
        nothing to lend, `Admissions.reclaim_only`), so the victims must free what it lacks: free GPUs alone would
        take its cohort past what it may use (found by review: such a job was placed on another cohort's idle
        guarantee, preempting nobody)."""
        state, ctx = self.state, self.ctx
        now, shape = ctx.now, option.shape
        budgets: dict[str, int] | None = None
        quota_need: tuple[str, str, int] | None = None
        reclaim_need = 0
        past = 0
        if state.quota_on:
            if need is None and option.past and self._may_pass(job.team, shape.gpus, option.past):
                past = option.past
            key = (shape, job.team if need is None else f"{job.team}/displace")
            if past:
                key = (shape, f"{job.team}/past")
            book = state.quota
            assert book is not None
            if need is not None:
                stopping = sum(len(r.gpus) for r in ctx.stopping_jobs(state, need.team, need.pool))
                if need.gpus - stopping <= 0:
                    return False  # enough of its own work is already stopping: it is admitted once it has
                quota_need = (need.team, need.pool, need.gpus - stopping)
            elif option.reclaim or past:
                budgets = {
                    team: used - book.quota(team, pool).nominal - past
                    for (team, pool), used in state.usage.items()
                    if pool == shape.pool and team != job.team and used > book.quota(team, pool).nominal + past
                }
            reclaim = (option.reclaim or past > 0) and need is None
            if refused:
                if not past:
                    return False
                reclaim_need = max(1, past - state.usage.borrowable(job.team, shape.pool or ""))
            if not (reclaim and budgets) and state.preemptible_below(job.team, shape.pool or "", job.priority) <= 0:
                # Nobody it may reclaim from borrows, and the team has no lower-priority work to stop: no plan
                # (recorded as a failed one would be; a reclaim past the guarantee never was).
                if not past:
                    ctx.preempt_failed[key] = max(job.priority, ctx.preempt_failed.get(key, NO_PRIORITY))
                return False

            def allowed(r: RunningJob) -> bool:
                if r.team == job.team:
                    return can_be_victim(r, job.priority, now) and (need is None or r.pool == need.pool)
                return (
                    reclaim and r.pool == shape.pool and r.team in (budgets or ()) and can_be_reclaimed(r, now)
                    and (not past or r.priority <= job.priority)
                )  # fmt: skip
        else:
            key = (shape, "")
            if ctx.lowest_victim is None or job.priority <= ctx.lowest_victim:
                return False

            def allowed(r: RunningJob) -> bool:
                return can_be_victim(r, job.priority, now)

        if job.priority <= ctx.preempt_failed.get(key, NO_PRIORITY):
            return False
        if state.quota_on:  # only the team's own jobs, and those of the teams it reclaims from, may be taken
            victims = ctx.victims_of(state, [job.team, *(budgets or ())] if reclaim else [job.team])
        else:
            victims = ctx.victims(state)
        plan = plan_preemption(
            state.index, replace(job, shape=shape), victims, now, allowed, budgets=budgets,
            quota_need=quota_need, by_cost=True, strict_budgets=past > 0, reclaim_need=reclaim_need,
        )  # fmt: skip
        if plan is not None and refused and not admitted_after(state, job, shape.pool or "", plan.victims):
            plan = None  # what the victims free does not make room in the quota (their cohorts lend elsewhere)
        if plan is None:
            ctx.preempt_failed[key] = job.priority
            return False
        why = ""
        counted: tuple[RunningJob, ...] = ()
        if need is not None:
            why = f" to free team {job.team}'s quota"
            if quota_need is not None and quota_need[2] < need.gpus:
                # The plan counted the quota of the team's jobs already stopping as coming back: the job waits for
                # them as well as for its victims (placed when its victims had stopped, it held the team past its
                # borrowing limit until the others had; found by test_quota_invariants_over_time).
                counted = tuple(ctx.stopping_jobs(state, need.team, need.pool))
        elif past and any(v.team != job.team for v in plan.victims):
            why = f" to bring team {job.team} up to its guarantee ({past} GPUs past it, as borrowing)"
        self._preempt_for(job, plan.victims, plan.gpus, decisions, why=why, counted=counted)
        return True

    def consolidate(self, decisions: list[Decision]) -> None:
        """After the walk: open room, in the order the walk found them (see `Turn`), for the multi-GPU jobs that
        found none, with the GPUs that every job had its turn at and that are still free."""
        state, ctx = self.state, self.ctx
        waiting, ctx.to_consolidate = ctx.to_consolidate, []
        tails, ctx.consolidation_tails = ctx.consolidation_tails, []
        self._tail_refused = {}
        found: Iterable[tuple[Turn | None, PendingJob | None]] = waiting
        if tails:  # the closed lanes' heads, each at its turn in the second pass (None: its sub-queue's head)
            found = heapq.merge(waiting, *(tail.kept() for tail in tails), key=_turn)
        failed = ctx.consolidation_failed
        for turn, known in found:
            if state.index.free_total() < 2:
                return
            if known is None:  # a closed lane's head (see `_close_lane`)
                assert turn is not None
                self._consolidate_tail_head(turn[1][-1], decisions)
                continue
            job = known
            if state.queue.jobs.get(job.id) is not job:
                continue  # placed (backfilled) since, or nominated
            if budget_refusal(state, job):
                continue  # its team may not start it now (the walk may have passed it by without asking)
            mine = next((i for i, r in enumerate(ctx.reservations) if r.job_id == job.id), None)
            if mine is None and all(s in failed for s in self._pinned_shapes(job.shape)):
                continue  # no plan opens room for its shape in this context (`_try_consolidation`)
            if mine is not None:  # the GPUs its own reservation holds free are free for it
                for node, indices in ctx.held[mine].items():
                    state.index.give(node, indices)
            options = admissions(state, job, ctx, explain=False).options
            if not ctx.borrowing:  # the first pass was cut short: nobody borrows in this cycle, by moves neither
                options = [o for o in options if not o.borrowing]
            moved = any(self._try_consolidation(job, decisions, o) for o in options)
            if mine is None:
                continue
            if moved:  # the GPUs its reservation held and its new place does not use are free now
                del ctx.reservations[mine], ctx.held[mine]
                ctx.more_free()
            else:
                for node, indices in ctx.held[mine].items():
                    state.index.take(node, indices)

    def _consolidate_tail_head(self, sq: SubQueue, decisions: list[Decision]) -> None:
        """`consolidate` for the head of a closed lane's sub-queue, as for any job there, only cheaper (a thousand
        such heads a cycle, most of them refused by their quota): its team can only borrow (see
        `_split_by_guarantee`), so its admissions are the pools where borrowing admits it (`admissions` would find
        no displacement and nothing within the guarantee), and it holds no reservation (it was never looked at)."""
        state, ctx = self.state, self.ctx
        book = state.quota
        assert book is not None
        priority, _, team, shape, preemptible = sq.key
        shapes = self._pinned_shapes(shape)
        if all(s in ctx.consolidation_failed for s in shapes):
            return
        known = ctx.refused.get((team, shape.pool, shape.gpu_model, preemptible, priority))
        if known is not None and shape.gpus >= known[0]:
            return  # its quota refuses it (usage only grows within the cycle)
        usage, gpus, refused = state.usage, shape.gpus, self._tail_refused
        admitted = []
        for pool, pinned in zip(ctx.pools_of(state, shape), shapes, strict=True):
            least = refused.get((team, pool, preemptible))
            if least is not None and gpus >= least:
                continue  # refused fewer GPUs already in this consolidation (usage only grows in it)
            if admits(book, usage, team, pool, gpus, preemptible=preemptible)[0]:
                admitted.append(pinned)
            else:
                refused[(team, pool, preemptible)] = gpus
        if not admitted:  # most of them: asked first, from the sub-queue's key alone (a plan that fails moves nothing)
            return
        job = state.queue.head_of(sq)
        if job is None or budget_refusal(state, job):
            return
        for pinned in admitted:
            if self._try_consolidation(job, decisions, Option(pinned, True, False)):
                return

    def _try_consolidation(self, job: PendingJob, decisions: list[Decision], option: Option) -> bool:
        """Move a few small preemptible jobs elsewhere (each re-placed at once) to open room for this job on a
        fleet whose free GPUs suffice but are scattered (see `consolidation`). Where it fits as the fleet stands
        (GPUs a reservation given up in `consolidate` held), nothing is planned and it is not placed here: the next
        cycle gives those GPUs in queue order, to jobs that are not on this list as well (placing it here let a
        lower-priority job take what a waiting higher-priority one could use: found by review, a test pins it)."""
        state, ctx = self.state, self.ctx
        shape, now = option.shape, ctx.now
        if shape in ctx.consolidation_failed:
            return False

        def movable(r: RunningJob) -> bool:
            return (
                r.preemptible and not r.stopping and r.priority <= job.priority and r.id not in ctx.fresh
                and now - r.started_at >= r.min_runtime_s
            )  # fmt: skip

        plan = plan_consolidation(
            state.index, shape, ctx.on_node(state), now, movable=movable,
            max_moved_gpus=self.config.consolidation_max_moved_gpus,
        )  # fmt: skip
        if plan is None:
            ctx.consolidation_failed.add(shape)
            return False
        names = []
        for move in plan.moves:
            victim = move.job
            victim.stopping = True
            ctx.stopped(victim, moved=True)
            names.append(victim.id)
            state.hold_move(victim.id, move.to)
            grace = victim.checkpoint_grace_s
            decisions.append(
                Preempt(victim.id, victim.attempt, grace, f"moved to {move.to[0].node} to open room for {job.id} "
                        f"({job.shape.describe()}); {grace:g} s to checkpoint", by=job.id, move_to=move.to)
            )  # fmt: skip
        job.waiting_for = tuple(f"{m.job.id}/{m.job.attempt}" for m in plan.moves)
        state.nominate(job, plan.gpus)
        reason = f"moving {', '.join(names)} elsewhere to open room for {job.shape.describe()}; starts when they stop"
        decisions.append(Nominate(job.id, plan.gpus, reason, victims=job.waiting_for))
        return True

    def _backfill_into_reservation(self, job: PendingJob, decisions: list[Decision], options: list[Option]) -> bool:
        """Place the job partly on one reservation's held GPUs, if its estimate ends before that reservation's
        start (the soonest-starting reservations are the tightest, so the latest-starting ones are tried first),
        in a pool its quota admits it to (`options`, as `admissions` gives them)."""
        ctx, index = self.ctx, self.state.index
        estimate = job.estimate
        if estimate is None or not ctx.reserved_free:
            return False
        ends = ctx.now + estimate
        fitting = [
            (res.start, i) for i, res in enumerate(ctx.reservations) if res.start is not None and ends <= res.start
        ]
        unfit = ctx.unfit
        for _, i in sorted(fitting, reverse=True):
            held = ctx.held[i]
            if not held:
                continue
            holder = ctx.reservations[i].job_id
            for option in options:
                if (holder, option.shape) in unfit:
                    continue
                gpus = find_placement(index, option.shape, bonus=held)
                if gpus is not None:
                    break
                unfit.add((holder, option.shape))
            else:
                continue
            assert gpus is not None
            for ref in gpus:
                indices = held.get(ref.node)
                if indices is not None and ref.index in indices:
                    indices.remove(ref.index)
                    index.give(ref.node, [ref.index])
                    if not indices:
                        del held[ref.node]
            reason = _placed_reason(gpus) + f"; backfilled: ends before {ctx.reservations[i].job_id}'s reserved start"
            if option.borrowing:
                reason += "; borrowing idle quota"
            self._place(job, gpus, reason, decisions, borrowing=option.borrowing)
            return True
        return False

    def _reserve_behind(self, key: QueueKey, decisions: list[Decision]) -> int:
        """The head of a sub-queue got a reservation and more may be made: the jobs after it (same shape, same
        rights) get theirs too, in order, until one does not."""
        left = self.config.max_reservations - len(self.ctx.reservations)
        if left <= 0:
            return 0
        tested = 0
        for job in list(self.state.queue.after_head(key, left)):
            tested += 1
            if self.consider(job, decisions) != "reserved":
                break
        return tested

    def _pinned_shapes(self, shape: Shape) -> list[Shape]:
        """The shape pinned to each pool it may use (as `admissions` pins its options); itself without quotas."""
        ctx = self.ctx
        found = ctx.pinned_lists.get(shape)
        if found is None:
            found = ctx.pinned_lists[shape] = (
                [ctx.pinned(shape, p) for p in ctx.pools_of(self.state, shape)] if self.state.quota_on else [shape]
            )
        return found

    def _may_look_ahead(self) -> bool:
        """Whether `_backfill_behind` might look behind a blocked head: a reservation holds GPUs free until a known
        start, and the cycle's backfill budget is not spent."""
        ctx = self.ctx
        return (
            ctx.reserved_free
            and ctx.backfill_tested < self.config.backfill_budget
            and any(r.start is not None for r in ctx.reservations)
        )

    def _backfill_behind(self, key: QueueKey, decisions: list[Decision]) -> int:
        """After a blocked sub-queue head, look a little further for jobs short enough to backfill. The jobs behind
        it have its shape: once that shape is known to fit on no reservation's held GPUs (`CycleContext.unfit`),
        none of them is looked at, and the cycle's budget is kept for heads of other shapes."""
        ctx = self.ctx
        shapes = self._pinned_shapes(key[3])
        if not self._may_look_ahead() or not ctx.may_backfill(None, shapes):
            return 0
        budget = self.config.backfill_budget - ctx.backfill_tested
        tested = 0
        for job in list(self.state.queue.after_head(key, min(budget, self.config.backfill_lookahead))):
            tested += 1
            if job.estimate is None or budget_refusal(self.state, job):
                continue
            # Each job behind the blocked head is admitted on its own (in the first pass, only within the
            # guarantee), or it does not start. Behind a head refused outright nothing is looked at (`_walk`).
            admitted = admissions(self.state, job, ctx, explain=False).options
            options = [o for o in admitted if ctx.borrowing or not o.borrowing]
            if options:
                self._backfill_into_reservation(job, decisions, options)
                if not ctx.may_backfill(None, shapes):
                    break
        ctx.backfill_tested += tested
        return tested

    # ---- committing ------------------------------------------------------------------------------------------

    def _place(
        self, job: PendingJob, gpus: tuple[GpuRef, ...], reason: str, decisions: list[Decision], borrowing: bool = False
    ) -> None:
        decisions.append(self.state.place(job, gpus, reason, self.ctx.now, borrowing))
        self.ctx.fresh.add(job.id)

    def _preempt_for(
        self,
        job: PendingJob,
        victims: tuple[RunningJob, ...],
        gpus: tuple[GpuRef, ...],
        decisions: list[Decision],
        *,
        why: str = "",
        counted: tuple[RunningJob, ...] = (),
    ) -> None:
        """Stop `victims` for `job` and set `gpus` aside for it; it starts once they, and the jobs in `counted`
        (already stopping, whose quota its admission counted on), have stopped."""
        names = []
        for victim in victims:
            victim.stopping = True
            self.ctx.stopped(victim)
            names.append(victim.id)
            grace = victim.checkpoint_grace_s
            decisions.append(
                Preempt(victim.id, victim.attempt, grace, f"preempted by {job.id} (priority {job.priority}){why}; "
                        f"{grace:g} s to checkpoint", by=job.id)
            )  # fmt: skip
        job.waiting_for = tuple(f"{v.id}/{v.attempt}" for v in (*victims, *counted))
        self.state.nominate(job, gpus)
        reason = f"preempting {', '.join(names)}{why} for {job.shape.describe()}; starts when they stop"
        if counted:
            reason += f" (and {', '.join(r.id for r in counted)}, stopping already)"
        decisions.append(Nominate(job.id, gpus, reason, victims=job.waiting_for))

    def _place_nominated(self, decisions: list[Decision]) -> None:
        state = self.state
        for job_id, job in list(state.nominated.items()):
            gpus = job.nominated
            if any(g.slot in state.cordoned for g in gpus):
                state.drop_nomination(job_id)  # the plan no longer holds: the job competes again
                continue
            blocked_by = {state.holder[g.slot] for g in gpus if g.slot in state.holder}
            for victim in job.waiting_for:  # "job/attempt": a victim placed again since does not hold it up
                victim_id, _, attempt = victim.rpartition("/")
                run = state.running.get(victim_id)
                if run is not None and str(run.attempt) == attempt:
                    blocked_by.add(victim_id)
            if blocked_by:
                reason = f"waiting for {', '.join(sorted(blocked_by))} to stop (preempted for it)"
                decisions.append(Wait(job_id, Reason(WaitKind.PREEMPTING, reason)))
                continue
            moved = job_id in state.relocated
            how = " (moved to open room for another job)" if moved else " (on the GPUs it preempted for)"
            state.drop_nomination(job_id)
            job.waiting_for = ()
            self._place(job, gpus, _placed_reason(gpus) + how, decisions)

    def _interrupt(self, decisions: list[Decision]) -> None:
        state = self.state
        if not state.cordoned:
            return
        worst: dict[str, tuple[str, Cordon]] = {}
        """job -> the slot of its worst cordon, and that cordon (a fatal one over a degraded one: found by review,
        the first slot's decided, and a job with a degraded GPU 0 and a fatal GPU 5 got its whole grace)."""
        for slot in sorted(state.cordoned):
            job_id = state.holder.get(slot)
            if job_id is None:
                continue
            found = worst.get(job_id)
            if found is None or (state.cordoned[slot].fatal and not found[1].fatal):
                worst[job_id] = (slot, state.cordoned[slot])
        for job_id, (slot, cordon) in worst.items():
            job = state.running[job_id]
            if job.stopping:
                if not cordon.fatal or job.at_once:
                    continue
                # Stopping with a checkpoint grace (preempted, moved, drained for a degraded fault) when a GPU of it
                # failed: the grace is cut, as a fatal fault's interruption has none (found by review: the job held
                # its GPUs, and waited to start again elsewhere, for its whole grace).
                job.at_once = True
                why = f"interrupted at once: GPU {slot} failed during its checkpoint grace ({cordon.describe()})"
                decisions.append(Preempt(job.id, job.attempt, 0.0, why, interrupt=True))
                continue
            grace = 0.0 if cordon.fatal else job.checkpoint_grace_s
            job.stopping = True
            job.at_once = cordon.fatal
            self.ctx.stopped(job)
            decisions.append(
                Preempt(job.id, job.attempt, grace, f"interrupted: GPU {slot} unschedulable ({cordon.describe()})",
                        interrupt=True)
            )  # fmt: skip

    def _capacity_reason(self, job: PendingJob) -> Reason:
        index, ctx = self.state.index, self.ctx
        free = index.free_in(index.partitions_for(job.shape))
        text = f"waiting for {job.shape.describe()}"
        if not ctx.reservations:
            return Reason(WaitKind.CAPACITY, text, free)
        first = tuple(r.job_id for r in ctx.reservations[:3])
        return Reason(WaitKind.CAPACITY, text + "; capacity reserved for jobs ahead", free, reserved_for=first,
                      reserved_more=len(ctx.reservations) - len(first))  # fmt: skip


def returning(state: SchedulingState, job: RunningJob) -> bool:
    """A stopping job being moved (GPUs held for it, `SchedulingState.moves`): it starts again as soon as it has
    stopped, so the quota it holds does not come back to its team."""
    return job.id in state.moves


def _job(item: tuple[VictimCost, RunningJob]) -> RunningJob:
    return item[1]


def _cost(item: tuple[VictimCost, RunningJob]) -> VictimCost:
    return item[0]


def _turn(item: tuple[Turn | None, PendingJob | None]) -> Turn:
    assert item[0] is not None  # lanes are closed only within a walk, whose jobs all have their turn
    return item[0]


def _aged(job: PendingJob | None) -> bool:
    return job is not None and job.aged


def _expected_end(job: RunningJob, now: float) -> float | None:
    for unknown, at, _, _ in release_order((job,), now):
        return None if unknown else at
    return None


def _placed_reason(gpus: tuple[GpuRef, ...]) -> str:
    return placed_on(sorted({g.node for g in gpus}))
