"""The scheduler under team quotas: borrowing, reclaim, budgets; and the quota invariants over time."""

import heapq
import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, validate
from chamber.scheduler.core.decisions import Nominate, Place, Preempt, Wait
from chamber.scheduler.core.model import pending_from
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import make_job, make_node

NOW = 1000.0
NODES = [make_node(f"n{i}").gpus(4).build() for i in range(4)]  # 16 GPUs in pool "default"


def book(a: int, b: int, *, a_borrow: int | None = None, cohort_b: str = "c") -> QuotaBook:
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name="default", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[
                TeamConfig(name="a", org="org", cohort="c",
                           quotas=[TeamQuota(pool="default", nominal=a, borrowing_limit=a_borrow)]),
                TeamConfig(name="b", org="org", cohort=cohort_b, quotas=[TeamQuota(pool="default", nominal=b)]),
            ],
        ),
        capacity={"default": 16},
    )  # fmt: skip


def cycle(jobs: list, quota: QuotaBook, budget: dict[str, str] | None = None) -> list:  # type: ignore[type-arg]
    owners = {g.slot: r.id for r in jobs if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(NODES, owners, {}, jobs, quota=quota, budget_blocks=budget)
    return state.cycle(NOW)


def running(job_id: str, team: str, node: str, priority: str = "research") -> object:
    return make_job(job_id).team(team).priority(priority).running_on(*[(node, i) for i in range(4)]).build()


def test_idle_quota_is_lent_and_the_borrower_is_marked() -> None:
    jobs = [make_job("big").team("a").gpus(4, replicas=3).priority("research").build()]
    decisions = cycle(jobs, book(8, 8))
    (place,) = [d for d in decisions if isinstance(d, Place)]
    assert "borrowing" in place.reason


def test_non_preemptible_work_stays_within_nominal() -> None:
    jobs = [make_job("t").team("a").gpus(4, replicas=3).priority("train").build()]
    (wait,) = cycle(jobs, book(8, 8))
    assert isinstance(wait, Wait)
    assert "only preemptible jobs borrow" in wait.reason


def test_borrowing_limit_holds() -> None:
    jobs = [make_job("x").team("a").gpus(4, replicas=3).priority("research").build()]
    (wait,) = cycle(jobs, book(8, 8, a_borrow=2))
    assert isinstance(wait, Wait)
    assert "borrowing limit" in wait.reason


def test_the_owner_reclaims_borrowed_capacity_whatever_its_priority() -> None:
    jobs = [
        running("a1", "a", "n0"), running("a2", "a", "n1"), running("a3", "a", "n2"), running("b0", "b", "n3"),
        make_job("back").team("b").gpus(4).priority("best-effort").build(),
    ]  # fmt: skip
    decisions = cycle(jobs, book(8, 8))
    preempted = {d.job_id for d in decisions if isinstance(d, Preempt)}
    assert len(preempted) == 1
    assert preempted <= {"a1", "a2", "a3"}, "only a's borrowed work is reclaimed"
    assert any(isinstance(d, Nominate) and d.job_id == "back" for d in decisions)


def test_a_borrower_never_preempts_another_team() -> None:
    jobs = [
        running("b1", "b", "n0"), running("b2", "b", "n1"), running("a1", "a", "n2"), running("a2", "a", "n3"),
        make_job("more").team("a").gpus(4).priority("train").build(),
    ]  # fmt: skip
    decisions = cycle(jobs, book(8, 8))
    preempted = {d.job_id for d in decisions if isinstance(d, Preempt)}
    assert not preempted & {"b1", "b2"}, decisions


def test_a_team_displaces_its_own_lower_priority_work_when_its_quota_is_full() -> None:
    """Team a's quota is full of its own research work: its train job displaces one research job (not team b's,
    not both), and is nominated GPUs so nothing else takes the room (Kueue's withinClusterQueue: LowerPriority)."""
    jobs = [
        running("b1", "b", "n0"), running("b2", "b", "n1"), running("a1", "a", "n2"), running("a2", "a", "n3"),
        make_job("more").team("a").gpus(4).priority("train").build(),
    ]  # fmt: skip
    decisions = cycle(jobs, book(8, 8))
    (preempt,) = [d for d in decisions if isinstance(d, Preempt)]
    assert preempt.job_id in {"a1", "a2"}
    assert preempt.by == "more"
    (nominate,) = [d for d in decisions if isinstance(d, Nominate)]
    assert nominate.job_id == "more"
    assert nominate.victims == (f"{preempt.job_id}/{preempt.attempt}",)


def test_a_non_preemptible_job_within_nominal_never_waits_behind_its_teams_borrowed_work() -> None:
    """The issue's case: team a runs research jobs beyond its nominal (borrowing) and idle GPUs remain: its train
    job starts at once on the idle GPUs, and the team's research work now counts as the borrowing (nobody is
    preempted while the pool can lend)."""
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(4)]  # 32 GPUs
    research = [
        make_job(f"r{i}").team("a").priority("research").running_on(*[(f"n{i}", g) for g in range(8)]).build()
        for i in range(2)
    ]
    train = make_job("t").team("a").gpus(1).priority("train").build()
    quota = validate(
        QuotaConfig(
            pools=[PoolConfig(name="default", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[TeamConfig(name="a", org="org", cohort="c", quotas=[TeamQuota(pool="default", nominal=8)])],
        ),
        capacity={"default": 32},
    )
    owners = {g.slot: r.id for r in research if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(nodes, owners, {}, [*research, train], quota=quota)
    decisions = state.cycle(NOW)
    assert not [d for d in decisions if isinstance(d, Preempt)], decisions
    assert [d.job_id for d in decisions if isinstance(d, Place)] == ["t"]
    assert not state.running["t"].borrowed
    assert state.running["r0"].borrowed, "the research work is what borrows now"
    assert state.running["r1"].borrowed


@pytest.mark.parametrize(
    ("mode", "priority", "blocked"),
    [("block-all", "train", True), ("block-preemptible", "research", True), ("block-preemptible", "train", False)],
)
def test_budget_modes(mode: str, priority: str, blocked: bool) -> None:
    jobs = [make_job("j").team("a").gpus(4).priority(priority).build()]
    decisions = cycle(jobs, book(8, 8), budget={"a": mode})
    assert any(isinstance(d, Wait) and "budget" in d.reason for d in decisions) == blocked
    assert any(isinstance(d, Place) for d in decisions) != blocked


def _reclaim_could_place(state: SchedulingState, team: str, gpus: int, borrowed: int) -> bool:
    """Could a waiting job of `team` of `gpus` GPUs (one node: nodes here have 4 GPUs) be made room for on some node
    by what a reclaim may take: the team's own lower-priority preemptible work there, and the other team's
    preemptible jobs there as long as that team still borrows before each (so the victims taken other than the
    largest total less than `borrowed`)? A guarantee is a count of GPUs; whether they can be had on one node also
    depends on who holds the rest, and this is the room the rules allow."""
    for job in (j for j in state.queue.jobs.values() if j.team == team and j.shape.gpus == gpus):
        for name, node in state.index.nodes.items():
            own = theirs = 0
            others: list[int] = []
            for r in state.running.values():
                if r.stopping or not r.preemptible or not any(g.node == name for g in r.gpus):
                    continue
                if r.team == team and r.priority < job.priority:
                    own += len(r.gpus)
                elif r.team != team:
                    others.append(len(r.gpus))
            room = len(node.free) + own
            for k in range(len(others) + 1):
                for taken in itertools.combinations(others, k):
                    theirs = sum(taken)
                    if room + theirs >= gpus and (not taken or theirs - max(taken) < borrowed):
                        return True
    return False


# Found by this test (2026-12-05), team a held 8 GPUs of a guarantee of 7 with no borrowing allowed: a 4-GPU
# `train` job of a, admitted by displacing a's own `research` work, counted the quota of a's jobs already stopping
# (for b's reclaim) as coming back, and was placed when its own victim had stopped, before they had (first);
# and it counted a job being moved to open room for b's gang, which starts again at once (second).
_FIRST = [("a", 1, "research", 1, 0)] * 17 + [
    ("a", 1, "research", 29, 7), ("a", 1, "research", 29, 9), ("a", 1, "research", 173, 0), ("a", 1, "train", 1, 0),
    ("a", 1, "train", 202, 171), ("a", 1, "train", 284, 60), ("a", 2, "research", 145, 6),
    ("a", 2, "research", 198, 0), ("a", 4, "research", 223, 5), ("a", 4, "train", 1, 391),
    ("b", 2, "research", 281, 92), ("b", 4, "research", 1, 106), ("b", 4, "research", 269, 105),
]  # fmt: skip
_SECOND = [("a", 1, "research", 1, 0)] * 18 + [
    ("a", 1, "research", 3, 7), ("a", 1, "research", 30, 7), ("a", 1, "research", 173, 0),
    ("a", 1, "train", 202, 198), ("a", 1, "train", 227, 144), ("a", 2, "research", 172, 6),
    ("a", 2, "research", 225, 0), ("a", 4, "research", 223, 5), ("a", 4, "train", 1, 402),
    ("b", 2, "research", 282, 118), ("b", 4, "research", 1, 118), ("b", 4, "research", 283, 117),
]  # fmt: skip

# Found by this test too: team b, within its guarantee, waited 34 s for a reclaim of a's one 4-GPU job (a borrowing
# 1), because the plan's node-by-node order tried first a node of a's 1-GPU jobs, of which the budget allows one.
_THIRD = [
    ("a", 1, "research", 1, 0), ("a", 1, "research", 1, 0), ("a", 1, "research", 124, 20),
    ("a", 1, "research", 130, 102), ("a", 1, "research", 166, 143), ("a", 1, "research", 191, 41),
    ("a", 1, "research", 145, 0), ("a", 1, "research", 78, 232), ("a", 1, "research", 300, 10),
    ("a", 1, "research", 145, 0), ("a", 1, "research", 1, 0), ("a", 4, "research", 101, 145),
    ("a", 4, "train", 65, 215), ("a", 2, "research", 113, 133), ("b", 2, "research", 63, 247),
    ("b", 4, "research", 1, 248),
]  # fmt: skip


@settings(max_examples=300, deadline=None)
@example(jobs_spec=_FIRST, nominal_a=7, borrow=0)
@example(jobs_spec=_SECOND, nominal_a=7, borrow=0)
@example(jobs_spec=_THIRD, nominal_a=10, borrow=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([1, 2, 4]), st.sampled_from(["research", "train"]),
                  st.integers(1, 300), st.integers(0, 600)),
        min_size=1, max_size=30,
    ),
    st.integers(0, 16), st.sampled_from([None, 0, 4]),
)  # fmt: skip
def test_quota_invariants_over_time(jobs_spec: list[tuple[str, int, str, int, int]], nominal_a: int,
                                    borrow: int | None) -> None:  # fmt: skip
    """Pool capacity and borrowing limits are never exceeded (in GPUs held); a reclaimed job starts within its
    victims' grace; a team with demand within its nominal makes progress within the borrowers' grace whenever what
    reclaim may take would make room for it; everything its quota admits completes."""
    quota = book(nominal_a, 16 - nominal_a, a_borrow=borrow)
    grace = 30.0
    records = [
        make_job(f"j{i}").team(team).gpus(g).priority(p).grace_s(grace).at(float(t)).build()
        for i, (team, g, p, _, t) in enumerate(jobs_spec)
    ]
    durations = {f"j{i}": float(d) for i, (_, _, _, d, _) in enumerate(jobs_spec)}
    arrivals = sorted(((r.submitted_at, r.id) for r in records), reverse=True)
    by_id = {r.id: r for r in records}
    state = SchedulingState.from_snapshot(NODES, {}, {}, [], quota=quota)
    events: list[tuple[float, int, str, int]] = []
    started: dict[str, float] = {}
    pending = {r.id: pending_from(r) for r in records}
    done: set[str] = set()
    now = 0.0
    starved_since: dict[str, float] = {}
    last_have: dict[str, int] = {}
    nominated_at: dict[str, float] = {}
    for _ in range(3000):
        while arrivals and arrivals[-1][0] <= now:
            _, job_id = arrivals.pop()
            state.requeue(pending[job_id])
        placed = False
        for d in state.cycle(now):
            if isinstance(d, Nominate):
                nominated_at[d.job_id] = now
            if isinstance(d, Place):
                placed = True
                if d.job_id in nominated_at:
                    waited = now - nominated_at.pop(d.job_id)
                    assert waited <= grace + 2, f"{d.job_id} started {waited} s after its reclaim was decided"
                started[d.job_id] = now
                heapq.heappush(events, (now + durations[d.job_id], 1, d.job_id, d.attempt))
            elif isinstance(d, Preempt):
                heapq.heappush(events, (now + d.grace_s, 0, d.job_id, d.attempt))
        held_a = sum(len(r.gpus) for r in state.running.values() if r.team == "a")
        assert sum(len(r.gpus) for r in state.running.values()) <= 16, "pool capacity"
        if borrow is not None:
            assert held_a <= nominal_a + borrow, "borrowing limit: the GPUs team a holds"
        nominals = {"a": nominal_a, "b": 16 - nominal_a}
        for t, nominal in nominals.items():
            want = sum(j.shape.gpus for j in state.queue.jobs.values() if j.team == t)
            want += sum(j.shape.gpus for j in state.nominated.values() if j.team == t)
            have = state.usage.get((t, "default"), 0)
            smallest = min((j.shape.gpus for j in state.queue.jobs.values() if j.team == t), default=0)
            other = "b" if t == "a" else "a"
            borrowed = state.usage.get((other, "default"), 0) - nominals[other]
            if (
                want
                and have + smallest <= nominal
                and borrowed > 0
                and _reclaim_could_place(state, t, smallest, borrowed)
            ):
                if have > last_have.get(t, have):
                    starved_since[t] = now  # progress: a reclaim was decided or a job started
                starved_since.setdefault(t, now)
                # Whenever reclaiming what the other team borrows (and preempting the team's own lower-priority
                # work) would make room for the team's smallest waiting job, the team makes progress within the
                # victims' grace: the reclaim is decided at once, and the reclaimed job starts when they stop.
                assert now - starved_since[t] <= grace + 2, (
                    f"team {t} below its nominal without progress for {now - starved_since[t]} s"
                )
            else:
                starved_since.pop(t, None)
            last_have[t] = have
        next_arrival = arrivals[-1][0] if arrivals else None
        # The service's safety net: a cycle a second later (it runs one every second). A job placed in a cycle is
        # no victim in it, so without the next one a team within its guarantee waited for the next event to
        # reclaim from a job placed while it waited (34 s once, found by this test).
        tick = now + 1.0 if placed and (state.queue.jobs or state.nominated) else None
        if tick is not None and all(t is None or tick < t for t in (next_arrival, events[0][0] if events else None)):
            now = tick
            continue
        if not events and next_arrival is None:
            break
        if events and (next_arrival is None or events[0][0] <= next_arrival):
            now, kind, job_id, attempt = heapq.heappop(events)
            run = state.running.get(job_id)
            if run is None or run.attempt != attempt:
                continue
            state.release(job_id)
            if kind == 1:
                done.add(job_id)
            else:
                pending[job_id] = pending[job_id].requeued(attempt, now - started[job_id])
                state.requeue(pending[job_id])
        else:
            assert next_arrival is not None
            now = next_arrival

    def admissible(job_id: str) -> bool:
        r = by_id[job_id]
        nominal = nominal_a if r.spec.team == "a" else 16 - nominal_a
        if r.spec.priority == "train":
            return r.spec.gpus <= nominal
        room = 16 if r.spec.team == "b" or borrow is None else nominal + borrow
        return r.spec.gpus <= min(16, room)

    assert done == {j for j in by_id if admissible(j)}, "every job its quota admits ran to completion"
