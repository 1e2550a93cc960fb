"""Under quotas the cycle's first pass walks only the heads their team's guarantee might admit (the team below its
guarantee in a pool the head may use, or holding lower-priority preemptible work there to displace); the others go
straight to the second pass (`_Cycle._split_by_guarantee`). With a thousand teams at their quota, looking at each
of them in the first pass only to set it aside was most of that pass.

The claim: this changes no decision. On any quotas, cohorts, running work and queue, two cycles (the second after
some jobs end) place, preempt and nominate exactly what the unsplit walk does, in the same order, when the test
budget does not cut a pass short (the split only spends less of it in the first pass)."""

from dataclasses import dataclass
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Decision, Wait
from chamber.scheduler.core.model import PendingJob, pending_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.queue import Entry
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, pool_quota

TEAMS = ["a", "b", "c", "d", "e"]
CLASSES = ["inference", "train", "research", "best-effort"]
SIZES = [1, 1, 2, 4, 8]

Job = tuple[str, str, int]
"""(team, priority class, GPUs)."""
jobs = st.tuples(st.sampled_from(TEAMS), st.sampled_from(CLASSES), st.sampled_from(SIZES))


@dataclass
class Situation:
    nodes: int
    teams: list[tuple[str, str, int, int | None]]
    """(name, cohort, nominal, borrowing limit)."""
    unassigned: int
    running: list[Job]
    queued: list[Job]
    ends: list[int]
    standing: dict[str, float]


@st.composite
def situations(draw: st.DrawFn) -> Situation:
    return Situation(
        nodes=draw(st.integers(2, 5)),
        teams=[
            (t, draw(st.sampled_from(["c1", "c2"])), draw(st.integers(0, 12)), draw(st.none() | st.integers(0, 8)))
            for t in TEAMS
        ],
        unassigned=draw(st.integers(0, 8)),
        running=draw(st.lists(jobs, max_size=20)),
        queued=draw(st.lists(jobs, min_size=1, max_size=30)),
        ends=draw(st.lists(st.integers(0, 19), max_size=6)),
        standing={t: draw(st.sampled_from([-1.0, 0.0, 1.0])) for t in TEAMS},
    )


def job(job_id: str, team: str, cls: str, gpus: int, at: float) -> PendingJob:
    return pending_from(make_job(job_id).team(team).priority(cls).gpus(gpus).at(at).build())


def decide(situation: Situation) -> list[list[Decision]]:
    """Two cycles on the situation: the first, then another after some running jobs end."""
    state = SchedulingState(SchedulerConfig(max_tests_per_cycle=10**9))
    for i in range(situation.nodes):
        state.index.add_node(f"n{i}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    capacity = max(situation.nodes * 8, sum(t[2] for t in situation.teams) + situation.unassigned)
    state.set_quota(pool_quota(capacity, *situation.teams), standing=situation.standing)
    running = []
    for i, (team, cls, gpus) in enumerate(situation.running):
        pending = job(f"r{i}", team, cls, gpus, float(i))
        where = find_placement(state.index, pending.shape)
        if where is not None:
            state.place(pending, where, "running", float(i), borrowing=False)
            running.append(pending.id)
    state.mark_borrowed()
    for i, (team, cls, gpus) in enumerate(situation.queued):
        state.add(job(f"q{i}", team, cls, gpus, 100.0 + i))
    out = [state.cycle(200.0)]
    for i in situation.ends:
        if running and state.running.get(running[i % len(running)]) is not None:
            state.release(running[i % len(running)])
    out.append(state.cycle(300.0))
    return out


def unsplit(self: _Cycle, items: list[Entry]) -> tuple[list[Entry], list[Entry], list[Entry]]:
    return items, [], []


def moves(cycles: list[list[Decision]]) -> list[list[Decision]]:
    return [[d for d in decisions if not isinstance(d, Wait)] for decisions in cycles]


@settings(max_examples=300, deadline=None)
@given(situations())
def test_walking_only_guaranteed_heads_first_changes_no_decision(situation: Situation) -> None:
    split = decide(situation)
    with patch.object(_Cycle, "_split_by_guarantee", unsplit):
        whole = decide(situation)
    assert moves(split) == moves(whole)
