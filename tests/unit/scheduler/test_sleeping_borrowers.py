"""A cycle passes by the parked groups that only borrowing could admit (their team at or above its guarantee, with
no lower-priority preemptible work of its own) and gives them their turn in the second pass only while their
cohort can lend (`_Cycle._borrowers_only`, `_borrower_turns`, `_next_turn`). That is a shortcut: the cycle must
decide exactly what it decides when it looks at every group in its turn. Property-tested on random quotas,
cohorts, fleets and job streams, cycle after cycle, with jobs finishing and preempted ones returning."""

import heapq
import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Decision, Place, Preempt
from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import pool_quota

PRIORITIES = [(1000, False), (500, True), (300, True), (100, True)]


@dataclass(frozen=True)
class Case:
    seed: int
    teams: int
    cohorts: int
    unassigned: int
    """GPUs of the pool no team is guaranteed (lent to every cohort)."""
    limit: int | None
    """Every team's borrowing limit."""
    jobs: int


CASES = st.builds(
    Case,
    seed=st.integers(0, 10**6),
    teams=st.integers(2, 8),
    cohorts=st.integers(1, 3),
    unassigned=st.sampled_from([0, 4, 12]),
    limit=st.sampled_from([None, 0, 4]),
    jobs=st.integers(10, 60),
)


def _world(case: Case) -> SchedulingState:
    seed, teams, cohorts, unassigned, limit = case.seed, case.teams, case.cohorts, case.unassigned, case.limit
    rng = random.Random(seed)
    state = SchedulingState()
    nodes = rng.randint(2, 5)
    for i in range(nodes):
        state.index.add_node(f"n{i}", pool="default", model="H100", rack=f"r{i % 2}", zone="z", capacity=8,
                             free=range(8))  # fmt: skip
    capacity = nodes * 8
    nominal = max(0, (capacity - unassigned) // teams)
    state.set_quota(pool_quota(
        capacity, *[(f"t{i}", f"c{i % cohorts}", rng.choice([0, nominal // 2, nominal]), limit) for i in range(teams)]
    ))  # fmt: skip
    return state


def _jobs(seed: int, teams: int, n: int) -> list[PendingJob]:
    rng = random.Random(seed + 1)
    jobs = []
    for i in range(n):
        priority, preemptible = rng.choice(PRIORITIES)
        per, replicas = rng.choice([(1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (8, 2)])
        jobs.append(PendingJob(
            id=f"j{i}", team=f"t{rng.randrange(teams)}", priority=priority, shape=Shape(per, replicas),
            submitted_at=float(rng.randrange(100)), preemptions=0, attempt=0,
            est_runtime_s=rng.choice([None, 300.0, 3000.0]), preemptible=preemptible, checkpoint_grace_s=10.0,
            checkpoint_interval_s=600.0,
        ))  # fmt: skip
    return jobs


def _run(case: Case, *, shortcut: bool) -> list[str]:
    """The decisions of 40 cycles, in words (reasons too), with or without the shortcut."""
    state = _world(case)
    rng = random.Random(case.seed + 2)
    n = case.jobs
    jobs = _jobs(case.seed, case.teams, n)
    by_id = {j.id: j for j in jobs}
    for job in jobs[: n // 2]:
        state.add(job)
    later = jobs[n // 2 :]
    events: list[tuple[float, str, str, int]] = []
    log: list[str] = []
    now = 100.0
    original = _Cycle._borrowers_only
    if not shortcut:
        _Cycle._borrowers_only = lambda self: {}  # type: ignore[method-assign]
    try:
        for step in range(40):
            if later and step % 3 == 0:
                state.add(later.pop())
            decisions: list[Decision] = state.cycle(now)
            log.extend(_describe(d) for d in decisions)
            for d in decisions:
                if isinstance(d, Place):
                    heapq.heappush(events, (now + rng.choice([60.0, 200.0, 900.0]), "finish", d.job_id, d.attempt))
                elif isinstance(d, Preempt):
                    heapq.heappush(events, (now + d.grace_s, "stop", d.job_id, d.attempt))
            now += 60.0
            while events and events[0][0] <= now:
                _, kind, job_id, attempt = heapq.heappop(events)
                running = state.running.get(job_id)
                if running is None or running.attempt != attempt:
                    continue
                ended = state.release(job_id)
                if kind == "stop" and ended is not None:
                    state.requeue(by_id[job_id].requeued(ended.attempt, now - ended.started_at))
    finally:
        _Cycle._borrowers_only = original  # type: ignore[method-assign]
    return log


def _describe(d: Decision) -> str:
    why = getattr(d, "why", None)
    return f"{type(d).__name__} {d.job_id} {getattr(d, 'gpus', '')} {getattr(d, 'reason', '')} {why or ''}"


@settings(max_examples=150, deadline=None)
@given(CASES)
def test_passing_sleeping_borrowers_by_decides_what_looking_at_each_decides(case: Case) -> None:
    assert _run(case, shortcut=True) == _run(case, shortcut=False)
