"""Under quotas the second pass takes the sub-queues of teams that can only borrow (at or above their guarantee, no
lower-priority work to displace) in one lane per shape, and closes a lane once no later head of it could start in
the cycle: when a head of it is hopeless for reasons that hold for every later head of the shape
(`_Cycle._shape_hopeless`: no reservation left to make or to backfill into, the shape blocked in every pool it may
use, no room to open for it after the walk), or when, after a head of it was decided, its pools have fewer GPUs
free than it asks for and no reservation is left to make or to backfill into (`_Cycle._no_room_left`: under quotas
a head is often refused before its placement is tried, so on a full fleet the shape was never found blocked).
When room might still be opened after the walk, the lane's rest goes to `consolidate`, which takes each of its
heads at its turn. On a full, fragmented fleet with a thousand teams, most of the second pass's heads were such
gangs, each looked at only to be found hopeless or refused.

The claim: this changes no placement, preemption or nomination. On any quotas in two pools, cohorts, running work,
queue and arrivals (the situations of `test_guarantee_split`), on a fragmented pool under quotas (those of
`test_hopeless_heads`), on a crowded pool and on a scattered one (below), three decision rounds decide exactly
what they decide with no lane ever closed, while the cycle's test budget (`max_tests_per_cycle`) is not reached
(a head a closed lane skips is not counted, so the budget then reaches further). A head a closed lane skips gets
no new waiting reason in the cycle (it keeps its last one), as any hopeless head. Cases a review found are kept in
`test_lane_reviews`."""

from contextlib import ExitStack
from dataclasses import dataclass, replace
from unittest.mock import patch

from hypothesis import example, given, settings
from hypothesis import strategies as st

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Wait
from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import pool_quota
from tests.support.core import pure_core_only
from tests.unit.scheduler.test_guarantee_split import Situation, decide, job, moves, situations, unsplit
from tests.unit.scheduler.test_hopeless_heads import Fragmented, decide_fragmented, fragmented, packed_pool


def never_closing(self: _Cycle, shape: Shape) -> str:
    return ""


def lanes_open() -> ExitStack:
    """No shape lane is ever closed (neither after a hopeless head nor once no room is left for its shape)."""
    stack = ExitStack()
    stack.enter_context(patch.object(_Cycle, "_shape_hopeless", never_closing))
    stack.enter_context(patch.object(_Cycle, "_no_room_left", lambda self, shape: False))
    return stack


@pure_core_only
@settings(max_examples=300, deadline=None)
@given(situations())
def test_closing_shape_lanes_changes_no_decision(situation: Situation) -> None:
    closing = decide(situation)
    with lanes_open():
        open_lanes = decide(situation)
    assert moves(closing) == moves(open_lanes)


@pure_core_only
@settings(max_examples=400, deadline=None)
@given(fragmented())
def test_closing_shape_lanes_on_a_fragmented_pool_changes_no_decision(case: Fragmented) -> None:
    case = replace(case, quotas=case.quotas or [("a", "c1", 0, None)], strict="")
    closing = decide_fragmented(case)
    with lanes_open():
        open_lanes = decide_fragmented(case)
    assert moves(closing) == moves(open_lanes)


TEAMS = ["a", "b", "c", "d", "e", "f"]
ESTIMATES = st.none() | st.sampled_from([50.0, 5000.0])


@dataclass
class Crowded:
    """A pool nearly full of small preemptible jobs of teams mostly at or above their guarantee (so most of their
    heads can only borrow, and go to the shape lanes), some of which end (the free GPUs are scattered), and heads
    of every size waiting: the bench's thousand teams in small."""

    nodes: int
    running: list[tuple[str, str, int, float | None]]
    """(team, priority class, GPUs, estimate), placed best fit in order."""
    ended: set[int]
    later: set[int]
    queued: list[tuple[str, str, int, float | None]]
    quotas: list[tuple[str, str, int, int | None]]
    """(team, cohort, nominal, borrowing limit); guarantees may add up to more than the pool holds, so the
    quota admits heads that then find no room (their shape is blocked)."""
    reservations: int


@st.composite
def crowded(draw: st.DrawFn) -> Crowded:
    nodes = draw(st.integers(2, 5))
    runs = {t: draw(st.sampled_from(["train", "research", "best-effort"])) for t in TEAMS}
    """Each team's running jobs are of one class: a team running non-preemptible work, or work of the class of its
    heads, has nothing to displace for them."""
    small = st.tuples(st.sampled_from(TEAMS), st.sampled_from([1, 1, 2]), ESTIMATES)
    return Crowded(
        nodes=nodes,
        running=[(t, runs[t], g, e) for t, g, e in draw(st.lists(small, min_size=5 * nodes, max_size=7 * nodes))],
        ended=draw(st.sets(st.integers(0, 7 * nodes - 1), max_size=2 * nodes)),
        later=draw(st.sets(st.integers(0, 7 * nodes - 1), max_size=4)),
        queued=draw(st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(["train", "research", "best-effort"]),
                                       st.sampled_from([1, 2, 2, 4, 4, 8]), ESTIMATES), min_size=1, max_size=40)),
        quotas=[(t, draw(st.sampled_from(["c1", "c2"])), draw(st.integers(0, 3 * nodes)),
                 draw(st.none() | st.integers(0, 6))) for t in TEAMS],
        reservations=draw(st.sampled_from([0, 0, 1, 2])),
    )  # fmt: skip


def decide_crowded(case: Crowded) -> list[list[Decision]]:
    """Three rounds: a cycle, the arrivals against it, a cycle after more small jobs end."""
    config = SchedulerConfig(max_tests_per_cycle=10**9, max_reservations=case.reservations)
    state, running = packed_pool(config, case.nodes, case.quotas, case.running, case.ended)
    queued = [job(f"q{i}", (team, cls, gpus, None, estimate), 100.0 + i)
              for i, (team, cls, gpus, estimate) in enumerate(case.queued)]  # fmt: skip
    return three_rounds(
        state, queued, [running[i] for i in sorted(case.later) if i < len(running)], (200.0, 210.0, 300.0)
    )


def three_rounds(
    state: SchedulingState, queued: list[PendingJob], ending: list[str], at: tuple[float, float, float]
) -> list[list[Decision]]:
    """A cycle with the first half of `queued` waiting, the rest decided as arrivals against it, then a cycle after
    the running jobs `ending` end (those still running), at the three times `at`: each round's decisions."""
    half = len(queued) // 2
    for pending in queued[:half]:
        state.add(pending)
    out = [state.decide(at[0])]
    for pending in queued[half:]:
        state.add(pending)
    out.append(state.decide(at[1]))
    for job_id in ending:
        if job_id in state.running:
            state.release(job_id)
    out.append(state.decide(at[2]))
    return out


@pure_core_only
@settings(max_examples=500, deadline=None)
@given(crowded())
def test_closing_shape_lanes_on_a_crowded_pool_changes_no_decision(case: Crowded) -> None:
    closing = decide_crowded(case)
    with lanes_open():
        open_lanes = decide_crowded(case)
    assert moves(closing) == moves(open_lanes)


@dataclass
class Scattered:
    """Every node holds a few free GPUs among one-GPU jobs of team x (at its guarantee, lending nothing), so no
    gang fits anywhere although the pool's free GPUs often suffice (room may be opened by moving x's jobs), and
    teams that can only borrow (no guarantee, or one they already use) wait with gangs of a few shapes: long
    shape lanes whose heads are found hopeless, closed with their rest handed to `consolidate`."""

    busy: list[int]
    """x's jobs on each node (8 GPUs each)."""
    spare: int
    """Capacity the quota book has beyond the nodes' (unassigned: what the teams borrow)."""
    nominal: dict[str, int]
    cohorts: dict[str, str]
    queued: list[tuple[str, str, int]]
    """(team, priority class, GPUs)."""
    later: set[int]
    """x's jobs (by number) that end before the third round."""
    reservations: int


@st.composite
def scattered(draw: st.DrawFn) -> Scattered:
    return Scattered(
        busy=draw(st.lists(st.integers(4, 7), min_size=2, max_size=6)),
        spare=draw(st.integers(0, 16)),
        nominal={t: draw(st.sampled_from([0, 0, 0, 2, 4])) for t in TEAMS},
        cohorts={t: draw(st.sampled_from(["c1", "c2"])) for t in TEAMS},
        queued=draw(st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(["train", "research", "best-effort"]),
                                       st.sampled_from([1, 2, 4, 4, 4, 8])), min_size=1, max_size=40)),
        later=draw(st.sets(st.integers(0, 20), max_size=6)),
        reservations=draw(st.sampled_from([0, 0, 1, 2])),
    )  # fmt: skip


def decide_scattered(case: Scattered) -> list[list[Decision]]:
    """Three rounds: a cycle, the arrivals against it, a cycle after some of x's jobs end."""
    state = SchedulingState(SchedulerConfig(max_tests_per_cycle=10**9, max_reservations=case.reservations))
    smalls: list[str] = []
    for n, busy in enumerate(case.busy):
        state.index.add_node(f"n{n}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
        for i in range(busy):
            small = job(f"x{len(smalls)}", ("x", "research", 1, None, None), 0.0)
            state.place(small, (GpuRef(f"n{n}", i),), "running", 0.0, borrowing=False)
            smalls.append(small.id)
    teams = [("x", "cx", len(smalls), None)] + [(t, case.cohorts[t], case.nominal[t], None) for t in TEAMS]
    state.set_quota(pool_quota(8 * len(case.busy) + case.spare + sum(case.nominal.values()), *teams))
    state.mark_borrowed()
    queued = [job(f"q{i}", (team, cls, gpus, None, None), 100.0 + i) for i, (team, cls, gpus) in enumerate(case.queued)]
    return three_rounds(state, queued, [smalls[i] for i in sorted(case.later) if i < len(smalls)],
                        (2000.0, 2010.0, 3000.0))  # fmt: skip


FIRST_PASS_GANG_FIRST = Scattered(
    busy=[4, 5, 5], spare=0, nominal={"a": 4, "b": 0, "c": 0, "d": 4, "e": 0, "f": 0},
    cohorts=dict.fromkeys(TEAMS, "c1"),
    queued=[("a", "best-effort", 4), ("b", "train", 4), ("b", "research", 4), ("d", "train", 4)]
    + [("a", "train", 1)] * 4,
    later=set(), reservations=0,
)  # fmt: skip
"""Found by this test: d's gang takes n0's 4 free GPUs; a's best-effort gang (first pass) joins the
consolidation list before b's research gang (second pass, in a closed lane's rest), though b's comes first in
queue order. Room is tried for them in the order the walk found them: a's first (x's research jobs may not move
for it, so the shape fails), then b's not at all. The lane's rest was merged by queue order alone, and room was
opened for b's gang."""


@pure_core_only
@example(FIRST_PASS_GANG_FIRST)
@settings(max_examples=500, deadline=None)
@given(scattered())
def test_closing_shape_lanes_on_a_scattered_pool_changes_no_decision(case: Scattered) -> None:
    closing = decide_scattered(case)
    with lanes_open():
        open_lanes = decide_scattered(case)
    assert moves(closing) == moves(open_lanes)


def gangs_on_a_fragmented_pool() -> SchedulingState:
    """Five nodes of 8 GPUs, each with five one-GPU jobs of team x (at its guarantee of 25): 15 GPUs free, 3 per
    node, none with 4. Teams a, b and c (no guarantee, borrowing the 15 unassigned GPUs) wait with a 4-GPU gang
    each, in that order: each can only borrow, so all three are in the 4-GPU lane of the second pass."""
    state = SchedulingState()
    for n in range(5):
        state.index.add_node(f"n{n}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
        for i in range(5):
            small = job(f"s{n}-{i}", ("x", "research", 1, None, None), 0.0)
            state.place(small, (GpuRef(f"n{n}", i),), "running", 0.0, borrowing=False)
    state.set_quota(pool_quota(40, ("x", "cx", 25, None), ("a", "c1", 0, None), ("b", "c1", 0, None),
                               ("c", "c1", 0, None)))  # fmt: skip
    state.mark_borrowed()
    for i, team in enumerate("abc"):
        state.add(job(f"{team}1", (team, "research", 4, None, None), 10.0 + i))
    return state


@pure_core_only
def test_a_gang_in_a_closed_lane_is_given_room_after_the_walk_at_its_turn() -> None:
    """a is looked at in full and reserved for; b is found hopeless (the one reservation is made, nothing fits,
    nothing to backfill into), but room might be opened for its shape after the walk, so the lane closes with c
    in its rest: c is not looked at in the walk at all. After it, room is opened for a, b and c, in that order,
    each by moving one small job, exactly as when c is looked at in the walk."""
    looked_at: list[str] = []
    consider, hopeless = _Cycle.consider, _Cycle._hopeless

    def considering(self: _Cycle, job: PendingJob, decisions: list) -> str:  # type: ignore[type-arg]
        looked_at.append(f"consider {job.id}")
        return consider(self, job, decisions)

    def judging(self: _Cycle, job: PendingJob) -> bool:
        looked_at.append(f"hopeless? {job.id}")
        return hopeless(self, job)

    with patch.object(_Cycle, "consider", considering), patch.object(_Cycle, "_hopeless", judging):
        decisions = gangs_on_a_fragmented_pool().cycle(100.0)
    assert looked_at == ["hopeless? a1", "consider a1", "hopeless? b1"]
    nominated = [d for d in decisions if isinstance(d, Nominate)]
    assert [d.job_id for d in nominated] == ["a1", "b1", "c1"]
    assert all(len(d.victims) == 1 for d in nominated)
    with lanes_open():
        assert moves([gangs_on_a_fragmented_pool().cycle(100.0)]) == moves([decisions])


def one_gpu_heads_behind_a_reservation() -> SchedulingState:
    """Node n0 runs x's 6-GPU job until t=1000 (2 GPUs free), n1 x's 8-GPU job (end unknown). Team g (below its
    guarantee) waits with an 8-GPU gang: the first pass reserves n0 for it from t=1000, holding its 2 free GPUs,
    so no GPU is free outside the reservation. Then a, b and c (no guarantee: they can only borrow) each wait
    with a one-GPU job, in that order, in the one-GPU lane of the second pass: a and b without an estimate, c
    ending after 100 s, before g's reserved start."""
    state = SchedulingState()
    for n in ("n0", "n1"):
        state.index.add_node(n, pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    for name, gpus, node, estimate in (("x6", 6, "n0", 1000.0), ("x8", 8, "n1", None)):
        running = job(name, ("x", "train", gpus, None, estimate), 0.0)
        state.place(running, tuple(GpuRef(node, i) for i in range(gpus)), "running", 0.0, borrowing=False)
    state.set_quota(pool_quota(40, ("x", "cx", 14, None), ("g", "cg", 16, None), ("a", "c1", 0, None),
                               ("b", "c1", 0, None), ("c", "c1", 0, None)))  # fmt: skip
    state.mark_borrowed()
    state.add(job("g1", ("g", "train", 8, None, None), 5.0))
    for i, team in enumerate("abc"):
        state.add(job(f"{team}1", (team, "research", 1, None, 100.0 if team == "c" else None), 10.0 + i))
    return state


@pure_core_only
def test_a_lane_stays_open_while_a_later_head_might_backfill() -> None:
    """a is looked at in full (its shape is then blocked) and b is found hopeless, but g's reservation holds free
    GPUs until a known start, so a later one-GPU head with an estimate might backfill there: the lane stays
    open, and c backfills."""
    decisions = one_gpu_heads_behind_a_reservation().cycle(0.0)
    placed = [d for d in decisions if isinstance(d, Place)]
    assert [d.job_id for d in placed] == ["c1"]
    assert [g.node for g in placed[0].gpus] == ["n0"]
    with lanes_open():
        assert moves([one_gpu_heads_behind_a_reservation().cycle(0.0)]) == moves([decisions])


def heads_behind_a_refused_gang() -> SchedulingState:
    """n0 (4 GPUs) runs x's job (end unknown); n1 (4 GPUs) runs x's 2-GPU job until t=500, 2 GPUs free: no 4-GPU
    gang fits. a (no guarantee, may not borrow) and b (no guarantee, may borrow) wait with a 4-GPU gang each, then
    c with a one-GPU job: all can only borrow."""
    state = SchedulingState()
    for n in ("n0", "n1"):
        state.index.add_node(n, pool="default", model="H100", rack="r", zone="z", capacity=4, free=range(4))
    for name, gpus, node, estimate in (("x4", 4, "n0", None), ("x2", 2, "n1", 500.0)):
        running = job(name, ("x", "train", gpus, None, estimate), 0.0)
        state.place(running, tuple(GpuRef(node, i) for i in range(gpus)), "running", 0.0, borrowing=False)
    state.set_quota(pool_quota(16, ("x", "cx", 6, None), ("a", "c1", 0, 0), ("b", "c1", 0, None),
                               ("c", "c1", 0, None)))  # fmt: skip
    state.mark_borrowed()
    for i, (team, gpus) in enumerate((("a", 4), ("b", 4), ("c", 1))):
        state.add(job(f"{team}1", (team, "research", gpus, None, None), 10.0 + i))
    return state


@pure_core_only
def test_a_lane_stays_open_while_a_later_head_may_still_be_reserved_for() -> None:
    """a's gang is refused by its quota, and no 4-GPU gang fits the 2 free GPUs, but the one reservation is not
    made yet: b's gang gets it (n1 from t=500, holding its 2 free GPUs), so c's job, which has no estimate to
    backfill with, does not start there. Had the lane been closed after a (no room left for 4 GPUs), c would
    have taken a GPU of the node b's gang is waiting for."""
    decisions = heads_behind_a_refused_gang().cycle(0.0)
    waits = {d.job_id: d.why.kind for d in decisions if isinstance(d, Wait)}
    assert waits == {"a1": WaitKind.QUOTA, "b1": WaitKind.RESERVED, "c1": WaitKind.CAPACITY}
    assert not moves([decisions])[0]
    with lanes_open():
        assert moves([heads_behind_a_refused_gang().cycle(0.0)]) == moves([decisions])


@pure_core_only
@settings(max_examples=200, deadline=None)
@given(crowded())
def test_the_split_changes_no_decision_on_a_crowded_pool(case: Crowded) -> None:
    """The whole split (first pass only for what a team's guarantee might admit, the rest in lanes, parked groups
    nothing could move left out: `_Cycle._split_by_guarantee`) against one walk of every head in both passes, on
    the crowded pools (the situations of `test_guarantee_split` have few parked groups of teams at their
    guarantee)."""
    split = decide_crowded(case)
    with patch.object(_Cycle, "_split_by_guarantee", unsplit):
        whole = decide_crowded(case)
    assert moves(split) == moves(whole)


@pure_core_only
@settings(max_examples=200, deadline=None)
@given(scattered())
def test_the_split_changes_no_decision_on_a_scattered_pool(case: Scattered) -> None:
    split = decide_scattered(case)
    with patch.object(_Cycle, "_split_by_guarantee", unsplit):
        whole = decide_scattered(case)
    assert moves(split) == moves(whole)
