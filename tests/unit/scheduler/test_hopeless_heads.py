"""A head the walk finds hopeless is not looked at in full (`_Cycle._hopeless`): its shape is blocked, it may not
preempt, and nothing it or a job behind it could backfill onto is left. Two refinements keep a contended cycle
from looking at most blocked gangs in full only to find that again:

- a gang is hopeless although no consolidation was tried yet in the cycle when its pool has fewer GPUs free than
  it asks for (no plan can open room then, and free GPUs only get fewer within a cycle); when a plan might, it is
  added to the list `consolidate` works through after the walk, at its turn, as `consider` would have added it;
- a shape found not to fit on a reservation's held GPUs (with the free ones) is not tried there again in the
  context (`CycleContext.unfit`), and a head of it is not kept from being hopeless by that reservation.

The claim: this changes no placement, preemption or nomination while the cycle's backfill budget lasts. On any
quotas (or none), running work, queue and arrivals (the situations of `test_guarantee_split`, and a fragmented
pool), three decision rounds decide exactly what the previous rule decides: every multi-GPU head looked at in full
until consolidation failed for its shape after the walk, every head with an estimate whenever a reservation it
would end before holds GPUs, and no fit remembered. The budget itself now goes further: the look-ahead behind a
head stops once its shape fits on no reservation (every job behind it has that shape), where it used to spend
the budget on jobs that could not backfill (the last test)."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.admission import Option
from chamber.scheduler.core.cycle import NO_PRIORITY, _Cycle
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Wait
from chamber.scheduler.core.model import PendingJob, pending_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, pool_quota
from tests.support.core import pure_core_only
from tests.unit.scheduler.test_guarantee_split import Situation, decide, job, moves, situations

_backfill_into_reservation = _Cycle._backfill_into_reservation


def previous_rule(self: _Cycle, job: PendingJob) -> bool:
    """`_hopeless` before the refinements."""
    ctx, shape = self.ctx, job.shape
    if len(ctx.reservations) < self.config.max_reservations:
        return False
    if self.config.consolidate and shape.gpus > 1:
        pools = ctx.pools_of(self.state, shape) if self.state.quota_on else [shape.pool]
        if any(ctx.pinned(shape, p) not in ctx.consolidation_failed for p in pools if p is not None) or (
            not self.state.quota_on and shape not in ctx.consolidation_failed
        ):
            return False
    if job.estimate is not None:
        ends = ctx.now + job.estimate
        pairs = zip(ctx.reservations, ctx.held, strict=True)
        if any(held and res.start is not None and ends <= res.start for res, held in pairs):
            return False
    if not self.state.quota_on:
        if shape not in ctx.blocked:
            return False
        return not (
            ctx.lowest_victim is not None
            and job.priority > ctx.lowest_victim
            and job.priority > ctx.preempt_failed.get((shape, ""), NO_PRIORITY)
        )
    return all(self._hopeless_in(job, pool) for pool in ctx.pools_of(self.state, shape))


def forgetting_no_fit(self: _Cycle, job: PendingJob, decisions: list[Decision], options: list[Option]) -> bool:
    self.ctx.unfit.clear()
    return _backfill_into_reservation(self, job, decisions, options)


def previously(situation: Situation, *, quota: bool) -> list[list[Decision]]:
    with (
        patch.object(_Cycle, "_hopeless", previous_rule),
        patch.object(_Cycle, "_backfill_into_reservation", forgetting_no_fit),
    ):
        return decide(situation, quota=quota)


TEAMS = ["a", "b", "c", "d", "e"]
ESTIMATES = st.none() | st.sampled_from([50.0, 500.0, 5000.0])


@dataclass
class Fragmented:
    """A pool full of small jobs of one priority, some of which ended (the free GPUs are scattered), and gangs of
    that priority and others waiting: the gangs cannot preempt the small jobs, only move them."""

    nodes: int
    running: list[tuple[str, int, float | None]]
    """(team, GPUs, estimate), all `research`, placed best fit in order."""
    ended: set[int]
    """Running jobs that end before the first round."""
    later: set[int]
    """Running jobs that end before the third round."""
    queued: list[tuple[str, str, int, float | None]]
    """(team, priority class, GPUs, estimate)."""
    quotas: list[tuple[str, str, int, int | None]] | None
    """(team, cohort, nominal, borrowing limit) in the one pool; None: quotas off."""
    reservations: int
    """`max_reservations` (0: every head may be found hopeless from the first)."""
    strict: str
    """"", "fifo" or "per team": `strict_fifo` or `strict_fifo_per_team` on."""


@st.composite
def fragmented(draw: st.DrawFn) -> Fragmented:
    nodes = draw(st.integers(3, 6))
    small = st.tuples(st.sampled_from(TEAMS), st.sampled_from([1, 1, 2]), ESTIMATES)
    classes = st.sampled_from(["research", "research", "best-effort", "train"])
    return Fragmented(
        nodes=nodes,
        running=draw(st.lists(small, min_size=4 * nodes, max_size=6 * nodes)),
        ended=draw(st.sets(st.integers(0, 6 * nodes - 1), min_size=nodes, max_size=4 * nodes)),
        later=draw(st.sets(st.integers(0, 6 * nodes - 1), max_size=4)),
        queued=draw(st.lists(st.tuples(st.sampled_from(TEAMS), classes, st.sampled_from([1, 2, 2, 4, 8]), ESTIMATES),
                             min_size=1, max_size=24)),
        quotas=draw(st.none() | st.lists(
            st.tuples(st.integers(0, 12), st.none() | st.integers(0, 8), st.sampled_from(["c1", "c2"])),
            min_size=5, max_size=5).map(lambda qs: [(t, c, n, lim) for t, (n, lim, c) in zip(TEAMS, qs, strict=True)])),
        reservations=draw(st.sampled_from([0, 1, 2])),
        strict=draw(st.sampled_from(["", "", "fifo", "per team"])),
    )  # fmt: skip


def packed_pool(
    config: SchedulerConfig,
    nodes: int,
    quotas: list[tuple[str, str, int, int | None]] | None,
    work: list[tuple[str, str, int, float | None]],
    ended: set[int],
) -> tuple[SchedulingState, list[str]]:
    """`nodes` 8-GPU nodes in pool "default" (quotas on it unless None), `work` (team, class, GPUs, estimate) placed
    best fit in order where it fits, then the placed jobs numbered in `ended` released: the state, and the jobs
    placed in order."""
    state = SchedulingState(config)
    for i in range(nodes):
        state.index.add_node(f"n{i}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    if quotas is not None:
        state.set_quota(pool_quota(max(8 * nodes, sum(q[2] for q in quotas)), *quotas))
    running: list[str] = []
    for i, (team, cls, gpus, estimate) in enumerate(work):
        pending = job(f"r{i}", (team, cls, gpus, None, estimate), float(i))
        where = find_placement(state.index, pending.shape)
        if where is not None:
            state.place(pending, where, "running", float(i), borrowing=False)
            running.append(pending.id)
    state.mark_borrowed()
    for i in sorted(ended):
        if i < len(running):
            state.release(running[i])
    return state, running


def decide_fragmented(case: Fragmented) -> list[list[Decision]]:
    """Three rounds: a cycle, the arrivals against it, a cycle after more small jobs end."""
    config = SchedulerConfig(
        max_tests_per_cycle=10**9,
        max_reservations=case.reservations,
        backfill_budget=UNSPENT,
        strict_fifo=case.strict == "fifo",
        strict_fifo_per_team=case.strict == "per team",
    )
    work = [(team, "research", gpus, estimate) for team, gpus, estimate in case.running]
    state, running = packed_pool(config, case.nodes, case.quotas, work, case.ended)
    half = len(case.queued) // 2
    for i, (team, cls, gpus, estimate) in enumerate(case.queued):
        if i == half:
            out = [state.decide(200.0)]
        state.add(job(f"q{i}", (team, cls, gpus, None, estimate), 100.0 + i))
    if half == 0:
        out = [[]]
    out.append(state.decide(210.0))
    for i in sorted(case.later):
        if i < len(running) and running[i] in state.running:
            state.release(running[i])
    out.append(state.decide(300.0))
    return out


@pure_core_only
@settings(max_examples=400, deadline=None)
@given(fragmented())
def test_skipping_hopeless_gangs_on_a_fragmented_pool_changes_no_decision(case: Fragmented) -> None:
    now = decide_fragmented(case)
    with (
        patch.object(_Cycle, "_hopeless", previous_rule),
        patch.object(_Cycle, "_backfill_into_reservation", forgetting_no_fit),
    ):
        before = decide_fragmented(case)
    assert moves(now) == moves(before)


UNSPENT = 10**9
"""A backfill budget no test spends (see the module's docstring)."""


@pure_core_only
@settings(max_examples=300, deadline=None)
@given(situations())
def test_skipping_hopeless_gangs_changes_no_decision_under_quotas(situation: Situation) -> None:
    situation = replace(situation, backfill_budget=UNSPENT)
    assert moves(decide(situation)) == moves(previously(situation, quota=True))


@pure_core_only
@settings(max_examples=200, deadline=None)
@given(situations())
def test_skipping_hopeless_gangs_changes_no_decision_without_quotas(situation: Situation) -> None:
    situation = replace(situation, backfill_budget=UNSPENT)
    assert moves(decide(situation, quota=False)) == moves(previously(situation, quota=False))


def small_jobs_everywhere(nodes: int, busy: int) -> SchedulingState:
    """`nodes` nodes of 8 GPUs, each with `busy` one-GPU research jobs (no estimates: nobody's end is known)."""
    state = SchedulingState()
    for n in range(nodes):
        state.index.add_node(f"n{n}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    for n in range(nodes):
        for i in range(busy):
            small = job(f"s{n}-{i}", ("x", "research", 1, None, None), 0.0)
            state.place(small, (GpuRef(f"n{n}", i),), "running", 0.0, borrowing=False)
    return state


def two_gangs(nodes: int) -> tuple[list[str], list[Nominate]]:
    """`small_jobs_everywhere(nodes, busy=5)` (3 GPUs free per node) with gangs a and b of 4 research GPUs waiting,
    in that order: the jobs the cycle looked at in full (`consider`), and its nominations."""
    state = small_jobs_everywhere(nodes, busy=5)
    state.add(job("a", ("a", "research", 4, None, None), 10.0))
    state.add(job("b", ("b", "research", 4, None, None), 11.0))
    with patch.object(_Cycle, "consider", autospec=True, side_effect=_Cycle.consider) as consider:
        decisions = state.cycle(100.0)
    return [call.args[1].id for call in consider.call_args_list], [d for d in decisions if isinstance(d, Nominate)]


@pure_core_only
def test_a_second_gang_of_a_blocked_shape_joins_the_consolidation_list_without_being_looked_at() -> None:
    """Four nodes with 3 GPUs free each (12 in all, none with 4): gang a is looked at, blocked and reserved for;
    gang b, of the same shape and priority, may neither preempt nor backfill, so the walk does not look at it in
    full, but room may still be opened for it (8 GPUs are free besides a's reservation). After the walk both are
    given room, each by moving one small job."""
    looked_at, nominated = two_gangs(nodes=4)
    assert looked_at == ["a"]
    assert [d.job_id for d in nominated] == ["a", "b"]
    assert all(len(d.victims) == 1 for d in nominated)


@pure_core_only
def test_a_gang_wider_than_the_free_gpus_is_not_looked_at_in_full() -> None:
    """Two nodes with 3 GPUs free each: gang a (4 GPUs) is blocked and reserved for, which holds 3 of the 6 free
    GPUs; gang b (4 GPUs) then has only 3 free to be given room with, so neither consolidation nor anything else
    can start it in this cycle and the walk passes it by. a is given room after the walk (its own reservation's
    GPUs count for it)."""
    looked_at, nominated = two_gangs(nodes=2)
    assert looked_at == ["a"]
    assert [d.job_id for d in nominated] == ["a"]


def test_a_shape_that_backfilled_onto_a_reservation_may_backfill_there_again() -> None:
    """One node: r runs 4 GPUs until t=1000, gang g (8 GPUs) is reserved the node from then, holding its 4 free
    GPUs. Two one-GPU jobs of other teams, each ending by t=300, both backfill there: a fit is remembered only when
    the shape did not fit (`CycleContext.unfit`); a 4-GPU job of 100 s then finds no room left there."""
    state = SchedulingState()
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    running = job("r", ("r", "research", 4, None, 1000.0), 0.0)
    state.place(running, tuple(GpuRef("n0", i) for i in range(4)), "running", 0.0, borrowing=False)
    state.add(job("g", ("g", "research", 8, None, None), 10.0))
    state.add(job("b", ("b", "research", 1, None, 100.0), 11.0))
    state.add(job("c", ("c", "research", 1, None, 100.0), 12.0))
    state.add(job("d", ("d", "research", 4, None, 100.0), 13.0))
    decisions = state.cycle(200.0)
    assert [d.job_id for d in decisions if isinstance(d, Place)] == ["b", "c"]
    assert state.ctx is not None
    assert {shape.gpus for _, shape in state.ctx.unfit} == {4}


def test_the_look_ahead_behind_a_gang_that_fits_on_no_reservation_leaves_the_budget_to_others() -> None:
    """One node: r runs 4 GPUs until t=1000; g (8 GPUs) is reserved the node from then, holding its 4 free GPUs.
    h waits with 8-GPU jobs, 16 of them short, behind a head without an estimate: none can fit on 4 GPUs. c waits
    with a one-GPU head without an estimate and a short one behind it. With a budget of 16, h's look-ahead used to
    spend it all; now it stops at its first job, and c's short job backfills."""
    state = SchedulingState(SchedulerConfig(order="fifo", backfill_budget=16))
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    running = job("r", ("r", "research", 4, None, 1000.0), 0.0)
    state.place(running, tuple(GpuRef("n0", i) for i in range(4)), "running", 0.0, borrowing=False)
    state.add(job("g", ("g", "research", 8, None, None), 10.0))
    state.add(job("h0", ("h", "research", 8, None, None), 11.0))
    for i in range(1, 17):
        state.add(job(f"h{i}", ("h", "research", 8, None, 100.0), 11.0 + i))
    state.add(job("c1", ("c", "research", 1, None, None), 30.0))
    state.add(job("c2", ("c", "research", 1, None, 100.0), 31.0))
    decisions = state.cycle(200.0)
    assert [d.job_id for d in decisions if isinstance(d, Place)] == ["c2"]
    assert state.ctx is not None
    assert state.ctx.backfill_tested == 2


def two_nodes_six_busy(config: SchedulerConfig) -> SchedulingState:
    """Two nodes with 6 of 8 GPUs busy each (research jobs whose ends are unknown)."""
    state = SchedulingState(config)
    for i in range(2):
        state.index.add_node(f"n{i}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
        busy = job(f"r{i}", ("r", "research", 6, None, None), float(i))
        state.place(busy, tuple(GpuRef(f"n{i}", k) for k in range(6)), "running", float(i), borrowing=False)
    return state


def test_a_gang_passed_by_still_ends_its_teams_turn_under_strict_fifo_per_team() -> None:
    """Found by review. g is reserved for (holding 2 free GPUs), h0 is blocked; team c's gang h cannot be given
    room (2 GPUs free), but under `strict_fifo_per_team` its blocked head still ends team c's turn: c's 1-GPU job
    j waits behind it."""
    state = two_nodes_six_busy(SchedulerConfig(strict_fifo_per_team=True))
    for i, (name, team, gpus) in enumerate((("g", "a", 8), ("h0", "b", 8), ("h", "c", 8), ("j", "c", 1))):
        state.add(job(name, (team, "research", gpus, None, None), 10.0 + i))
    assert not [d for d in state.cycle(200.0) if isinstance(d, Place)]


def test_a_gang_passed_by_still_ends_a_strict_fifo_walk() -> None:
    """Found by review. Without reservations, h0 (train) preempts for its 8 GPUs; h (research) may not preempt,
    and under `strict_fifo` its blocked head ends the walk: j, behind it, is not placed."""
    state = two_nodes_six_busy(SchedulerConfig(strict_fifo=True, max_reservations=0))
    state.index.add_node("n2", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    busy = job("r2", ("r", "research", 4, None, None), 2.0)
    state.place(busy, tuple(GpuRef("n2", k) for k in range(4)), "running", 2.0, borrowing=False)
    for i, (name, cls, gpus) in enumerate((("h0", "train", 8), ("h", "research", 8), ("j", "research", 1))):
        state.add(job(name, (name, cls, gpus, None, None), 10.0 + i))
    moved = [(type(d).__name__, d.job_id) for d in state.cycle(200.0) if not isinstance(d, Wait)]
    assert ("Nominate", "h0") in moved
    assert ("Place", "j") not in moved


def test_a_cancelled_nominee_gives_its_gpus_back_for_a_full_cycle() -> None:
    """Found by review. p was nominated 4 GPUs on n0 (2 free, 2 of v's, stopping). g is reserved n1 from t=1000,
    holding its 2 free GPUs; h0 (2 x 2 GPUs) found no room there. p is cancelled: the GPUs it was given are free
    again, so what the cycle concluded (h0's shape fits nowhere) no longer holds. The next decision, when k (of
    h0's shape) arrives, is a full cycle: h0, ahead of k, backfills on n1's held GPUs and n0's returned ones (it
    used to be decided against the stale conclusion, and nothing started)."""
    state = SchedulingState()
    for i in range(2):
        state.index.add_node(f"n{i}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    for name, cls, gpus, where, estimate in (
        ("w", "research", 4, ("n0", range(4)), None), ("v", "best-effort", 2, ("n0", range(4, 6)), None),
        ("r", "research", 6, ("n1", range(6)), 1000.0),
    ):  # fmt: skip
        running = job(name, (name, cls, gpus, None, estimate), 0.0)
        state.place(running, tuple(GpuRef(where[0], k) for k in where[1]), "running", 0.0, borrowing=False)
    p = job("p", ("p", "train", 4, None, None), 1.0)
    state.add(p)
    state.mark_stopping("v")
    p.waiting_for = ("v/0",)
    state.nominate(p, tuple(GpuRef("n0", k) for k in range(4, 8)))
    state.add(job("g", ("g", "research", 8, None, None), 10.0))
    state.add(pending_from(make_job("h0").team("h").priority("research").gpus(2, 2).at(11.0).estimate(100.0).build()))
    assert not [d for d in state.cycle(200.0) if isinstance(d, Place)]
    state.withdraw("p")
    state.add(pending_from(make_job("k").team("k").priority("research").gpus(2, 2).at(20.0).estimate(100.0).build()))
    assert [d.job_id for d in state.decide(210.0) if isinstance(d, Place)] == ["h0"]


def test_a_reservation_given_up_after_its_job_was_given_room_elsewhere_frees_what_it_held() -> None:
    """Found by review. a (8 GPUs, any pool) is reserved x0 (holding its 6 free GPUs), then given room on y0 by
    moving four small jobs; b (8 GPUs in X) is reserved x1 from t=2000, holding 4. h0 (2 x 4 GPUs in X) found no
    room. Once a's reservation is given up, x0's 6 GPUs are free: k, of h0's shape, arriving next, backfills on
    them and b's held GPUs."""
    state = SchedulingState(SchedulerConfig(max_reservations=2))
    for name, pool in (("x0", "X"), ("x1", "X"), ("y0", "Y"), ("y1", "Y")):
        state.index.add_node(name, pool=pool, model="H100", rack="r", zone="z", capacity=8, free=range(8))
    running: list[tuple[str, str, str, Sequence[int], float | None]] = [
        ("nx", "train", "x0", range(2), 1000.0), ("nb", "train", "x1", range(4), 2000.0),
        ("y", "research", "y1", range(4), None), *((f"m{k}", "research", "y0", [k], None) for k in range(4)),
    ]  # fmt: skip
    for name, cls, node, indices, estimate in running:
        built = make_job(name).team("run").priority(cls).gpus(len(indices)).at(0.0)
        placed = pending_from((built.estimate(estimate) if estimate else built).build())
        state.place(placed, tuple(GpuRef(node, k) for k in indices), "running", 0.0, borrowing=False)
    state.add(pending_from(make_job("a").team("a").priority("research").gpus(8).at(10.0).build()))
    state.add(pending_from(make_job("b").team("b").priority("research").gpus(8).pool("X").at(11.0).build()))
    h0 = make_job("h0").team("h").priority("research").gpus(4, 2).pool("X").at(12.0).estimate(100.0)
    state.add(pending_from(h0.build()))
    nominated = [(d.job_id, len(d.victims)) for d in state.cycle(200.0) if isinstance(d, Nominate)]
    assert nominated == [("a", 4)]
    k = make_job("k").team("k").priority("research").gpus(4, 2).pool("X").at(20.0).estimate(100.0)
    state.add(pending_from(k.build()))
    assert [d.job_id for d in state.decide(210.0) if isinstance(d, Place)] == ["k"]
