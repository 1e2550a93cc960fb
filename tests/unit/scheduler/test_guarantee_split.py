"""Under quotas the cycle's first pass walks only the heads their team's guarantee might admit (the team below its
guarantee in a pool the head may use, or holding lower-priority preemptible work there to displace); the others go
straight to the second pass (`_Cycle._split_by_guarantee`). With a thousand teams at their quota, looking at each
of them in the first pass only to set it aside was most of that pass.

The claim: this changes no decision. On any quotas in two pools, cohorts, running work (with estimates, so heads
get reservations and short jobs backfill), queue and arrivals, three decision rounds (a cycle, the arrivals
against it, a cycle after some jobs end) place, preempt and nominate exactly what the unsplit walk does, in the
same order, when the test budget does not cut a pass short (the split only spends less of it in the first pass).
The backfill budget is spent the same: no look-ahead runs behind a head refused outright (every job behind it is
refused too), wherever the walk meets that head.

A parked group of a team below its guarantee (or holding lower-priority work) that the first pass could neither
wake nor hand on, judged as the cycle starts, is left out of the cycle altogether; the last tests show a group
kept for each way it might move (its cohort lends again; its team's lower-priority work becomes enough to
displace, for a non-preemptible and for a preemptible head)."""

from dataclasses import dataclass
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, validate
from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt, Wait
from chamber.scheduler.core.model import PendingJob, pending_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.queue import Entry, ParkGroup, SubQueue, Walk
from chamber.scheduler.core.split import Lane
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, pool_quota
from tests.support.core import pure_core_only

TEAMS = ["a", "b", "c", "d", "e"]
POOLS = ["default", "other"]
CLASSES = ["inference", "train", "research", "best-effort"]
SIZES = [1, 1, 2, 4, 8]

Job = tuple[str, str, int, str | None, float | None]
"""(team, priority class, GPUs, pool (None: any), estimate)."""
jobs = st.tuples(
    st.sampled_from(TEAMS), st.sampled_from(CLASSES), st.sampled_from(SIZES),
    st.sampled_from([None, *POOLS]), st.none() | st.sampled_from([50.0, 500.0]),
)  # fmt: skip


@dataclass
class Situation:
    nodes: dict[str, int]
    """Nodes per pool."""
    quotas: dict[tuple[str, str], tuple[int, int | None]]
    """(team, pool) -> (nominal, borrowing limit)."""
    cohorts: dict[str, str]
    running: list[Job]
    queued: list[Job]
    ends: list[int]
    standing: dict[str, float]
    backfill_budget: int


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    return Situation(
        nodes={p: draw(st.integers(1, 3)) for p in POOLS},
        quotas={(t, p): (draw(st.integers(0, 10)), draw(st.none() | st.integers(0, 8))) for t in TEAMS for p in POOLS},
        cohorts={t: draw(st.sampled_from(["c1", "c2"])) for t in TEAMS},
        running=draw(st.lists(jobs, max_size=20)),
        queued=draw(st.lists(jobs, min_size=1, max_size=30)),
        ends=draw(st.lists(st.integers(0, 19), max_size=6)),
        standing={t: draw(st.sampled_from([-1.0, 0.0, 1.0])) for t in TEAMS},
        backfill_budget=draw(st.sampled_from([1, 3, 512])),
    )


def book(situation: Situation) -> QuotaBook:
    teams = [
        TeamConfig(name=t, org="org", cohort=situation.cohorts[t], quotas=[
            TeamQuota(pool=p, nominal=situation.quotas[(t, p)][0], borrowing_limit=situation.quotas[(t, p)][1])
            for p in POOLS
        ])
        for t in TEAMS
    ]  # fmt: skip
    config = QuotaConfig(pools=[PoolConfig(name=p, gpu_model="H100") for p in POOLS], orgs=[OrgConfig(name="org")],
                         teams=teams)  # fmt: skip
    capacity = {p: max(8 * situation.nodes[p], sum(situation.quotas[(t, p)][0] for t in TEAMS)) for p in POOLS}
    return validate(config, capacity=capacity)


def job(job_id: str, spec: Job, at: float) -> PendingJob:
    team, cls, gpus, pool, estimate = spec
    built = make_job(job_id).team(team).priority(cls).gpus(gpus).at(at)
    if pool is not None:
        built = built.pool(pool)
    if estimate is not None:
        built = built.estimate(estimate)
    return pending_from(built.build())


def decide(situation: Situation, *, quota: bool = True) -> list[list[Decision]]:
    """Two cycles on the situation (with arrivals decided in between): the first, then another after some
    running jobs end. Without `quota`, the same jobs with quotas off."""
    state = SchedulingState(SchedulerConfig(max_tests_per_cycle=10**9, backfill_budget=situation.backfill_budget))
    for pool in POOLS:
        for i in range(situation.nodes[pool]):
            state.index.add_node(f"{pool}-{i}", pool=pool, model="H100", rack="r", zone="z", capacity=8,
                                 free=range(8))  # fmt: skip
    state.set_quota(book(situation) if quota else None, standing=situation.standing)
    running = []
    for i, spec in enumerate(situation.running):
        pending = job(f"r{i}", spec, float(i))
        where = find_placement(state.index, pending.shape)
        if where is not None:
            state.place(pending, where, "running", float(i), borrowing=False)
            running.append(pending.id)
    state.mark_borrowed()
    half = len(situation.queued) // 2
    for i, spec in enumerate(situation.queued[:half]):
        state.add(job(f"q{i}", spec, 100.0 + i))
    out = [state.decide(200.0)]
    for i, spec in enumerate(situation.queued[half:], start=half):  # arrivals, against the first cycle
        state.add(job(f"q{i}", spec, 100.0 + i))
    out.append(state.decide(210.0))
    for i in situation.ends:
        if running and state.running.get(running[i % len(running)]) is not None:
            state.release(running[i % len(running)])
    out.append(state.decide(300.0))
    return out


def unsplit(self: _Cycle, items: list[Entry]) -> tuple[list[Entry], dict[Lane, list[Entry]]]:
    return items, {}


def moves(cycles: list[list[Decision]]) -> list[list[Decision]]:
    return [[d for d in decisions if not isinstance(d, Wait)] for decisions in cycles]


@pure_core_only
@settings(max_examples=300, deadline=None)
@given(situations())
def test_walking_only_guaranteed_heads_first_changes_no_decision(situation: Situation) -> None:
    split = decide(situation)
    with patch.object(_Cycle, "_split_by_guarantee", unsplit):
        whole = decide(situation)
    assert moves(split) == moves(whole)


def backfill_behind_refused_heads(config: SchedulerConfig, refused_teams: int, behind: int) -> list[Decision]:
    """One 8-GPU node; d runs 4 GPUs until t=1000. a (guarantee 8) waits with an 8-GPU job: it is reserved the
    node, holding its 4 free GPUs. Teams b0.. (no guarantee, may not borrow) wait each with a refused head and
    `behind` jobs after it. c waits with a 1-GPU head without an estimate (blocked) and a 1-GPU job of 100 s
    behind it, which ends before a's reserved start: it backfills if its look-ahead gets some of the budget.
    Order: a, the b teams, c (found by review: the look-ahead behind refused heads used up the budget)."""
    teams: list[tuple[str, str, int, int | None]] = [("a", "c1", 8, None), ("c", "c1", 4, None), ("d", "c1", 4, None)]
    teams += [(f"b{i}", "c1", 0, 0) for i in range(refused_teams)]
    state = SchedulingState(config)
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(16, *teams))
    running = job("r", ("d", "train", 4, None, 1000.0), 0.0)
    where = find_placement(state.index, running.shape)
    assert where is not None
    state.place(running, where, "running", 0.0, borrowing=False)
    state.mark_borrowed()
    at = 100.0
    state.add(job("a1", ("a", "research", 8, None, None), at))
    for i in range(refused_teams):
        for k in range(behind + 1):
            at += 1
            state.add(job(f"b{i}-{k}", (f"b{i}", "research", 1, None, None), at))
    state.add(job("c1", ("c", "research", 1, None, None), at + 1))
    state.add(job("c2", ("c", "research", 1, None, 100.0), at + 2))
    return state.cycle(200.0)


@pure_core_only
def test_no_look_ahead_behind_a_refused_head_spends_the_backfill_budget() -> None:
    """Behind a head its team's quota refuses, every job is refused too: looking at them spent the backfill
    budget (512 jobs by default, 16 behind each head) before a guaranteed team's short job was looked at. Now
    the look-ahead skips them, and the split walk and the whole walk backfill the same job."""
    for config, teams, behind in ((SchedulerConfig(backfill_budget=1), 1, 1), (SchedulerConfig(), 32, 16)):
        split = moves([backfill_behind_refused_heads(config, teams, behind)])
        with patch.object(_Cycle, "_split_by_guarantee", unsplit):
            whole = moves([backfill_behind_refused_heads(config, teams, behind)])
        assert split == whole
        assert [(type(d).__name__, d.job_id) for d in split[0]] == [("Place", "c2")]


@pure_core_only
@settings(max_examples=200, deadline=None)
@given(situations())
def test_every_group_the_second_pass_takes_from_a_lane_waits_on_its_cohort_alone(situation: Situation) -> None:
    """A cohort's lane is closed once one of its groups finds the cohort lends nothing more, which skips the rest:
    that is sound only while every group in it is, at its turn, of a team at or above its guarantee with no
    lower-priority preemptible work in the pool (`_Cycle._borrower_only`), whose turn depends on that lending
    alone. Checked at every group taken from a lane, in every round."""
    from_lane: list[object] = []
    pop, wake = Walk.pop, _Cycle._wake

    def popping(self: Walk) -> Entry | None:
        item = pop(self)
        from_lane.append(item[-1] if item is not None and self.lane is not None else None)
        return item

    def checking(self: _Cycle, group: ParkGroup) -> tuple[list[SubQueue], bool]:
        if from_lane and from_lane[-1] == group:
            assert self._borrower_only(group) is not None
        return wake(self, group)

    with patch.object(Walk, "pop", popping), patch.object(_Cycle, "_wake", checking):
        decide(situation)


def two_cycles(running: list[tuple[str, str, str, int]], queued: PendingJob, ends: str,
               *teams: tuple[str, str, int, int | None]) -> tuple[list[Decision], list[Decision]]:  # fmt: skip
    """Two 8-GPU nodes; `running` (id, team, class, GPUs) placed in order, `queued` waiting; a cycle, then `ends`
    ends, then another cycle: both cycles' decisions."""
    state = SchedulingState()
    for n in ("n0", "n1"):
        state.index.add_node(n, pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(16, *teams))
    for job_id, team, cls, gpus in running:
        pending = job(job_id, (team, cls, gpus, None, None), 0.0)
        where = find_placement(state.index, pending.shape)
        assert where is not None
        state.place(pending, where, "running", 0.0, borrowing=False)
    state.mark_borrowed()
    state.add(queued)
    first = state.cycle(100.0)
    state.release(ends)
    return first, state.cycle(200.0)


def test_a_parked_group_of_a_team_below_its_guarantee_is_handed_on_when_its_cohort_lends_again() -> None:
    """a (guarantee 4, running 2) waits with a 4-GPU research gang: 2 GPUs past what is left of its guarantee,
    and b (guarantee 8, using it all) lends nothing, so the gang is refused and parked. Once one of b's jobs ends,
    b lends 4: the first pass hands a's group on (only borrowing admits it), and the second pass places it."""
    first, second = two_cycles(
        [("a0", "a", "research", 2), ("b0", "b", "research", 4), ("b1", "b", "research", 4), ("x0", "x", "train", 4)],
        job("gang", ("a", "research", 4, None, None), 50.0), "b1",
        ("a", "c1", 4, None), ("b", "c1", 8, None), ("x", "cx", 4, None),
    )  # fmt: skip
    assert [d.job_id for d in first if isinstance(d, Place)] == []
    assert [d.job_id for d in second if isinstance(d, Place)] == ["gang"]


@pytest.mark.parametrize(
    ("cls", "lower"),
    [("train", "inference"), ("research", "research")],
    ids=["non-preemptible", "preemptible, its cohort lending nothing"],
)
def test_a_parked_job_displaces_its_teams_lower_work_once_that_is_enough(cls: str, lower: str) -> None:
    """t (guarantee 8) runs 6 GPUs of `lower` and 2 of best-effort: its 4-GPU `cls` job (which neither borrows nor,
    here, goes past the guarantee) is 4 GPUs over the guarantee and displacing the 2 best-effort ones is not
    enough: refused and parked. Once 2 GPUs of `lower` end it is only 2 over: the first pass wakes it, and it
    preempts the best-effort job for the room."""
    first, second = two_cycles(
        [("l0", "t", lower, 2), ("l1", "t", lower, 2), ("l2", "t", lower, 2), ("be", "t", "best-effort", 2),
         ("x0", "x", "train", 8)],
        job("wide", ("t", cls, 4, None, None), 50.0), "l2",
        ("t", "ct", 8, None), ("x", "cx", 8, None),
    )  # fmt: skip
    assert not [d for d in first if isinstance(d, Nominate | Preempt)]
    assert [(type(d).__name__, d.job_id) for d in second if not isinstance(d, Wait)] == [
        ("Preempt", "be"), ("Nominate", "wide"),
    ]  # fmt: skip
