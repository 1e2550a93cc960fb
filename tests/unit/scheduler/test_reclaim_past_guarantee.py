"""Reclaim past a guarantee, as a table of small snapshots and the decisions expected of one cycle.

A team below its guarantee whose smallest waiting job is wider than what is left of the guarantee (team a at 5
of 6 guaranteed GPUs, waiting with a 4-GPU job) may reclaim borrowed GPUs for that job, from jobs of at most its
priority of teams that still borrow at least as much as it will afterwards (Kueue's fair-sharing rule in GPUs
beyond the guarantee). Nodes have 4 GPUs; "n1:3" is 3 GPUs of node n1. The capacity beyond the teams' guarantees
is unassigned (lent to whoever borrows).
"""

from dataclasses import dataclass

import pytest

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, validate
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt
from chamber.scheduler.core.model import pending_from
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, make_node

NOW = 10_000.0
NODES = [make_node(f"n{i}").gpus(4).build() for i in range(4)]  # 16 GPUs in pool "default"


@dataclass(frozen=True)
class Case:
    name: str
    nominal: dict[str, int]
    running: list[tuple[str, str, str, str]]
    """(job, team, "node:gpus", priority): a job holding the first GPUs left on that node."""
    waiting: list[tuple[str, str, int, str]]
    """(job, team, GPUs, priority), submitted in this order."""
    preempted: set[str]
    """Whom the cycle preempts (empty: nobody)."""
    nominated: set[str]
    borrowed_after: dict[str, int] | None = None
    """GPUs each team borrows beyond its guarantee once the victims are gone and the preemptors run."""


# Team a at 5 of 6 guaranteed; team b (guarantee 4) borrows 7 on a full fleet: a's 4-GPU job takes it 3 past
# its guarantee, and b still borrows 3 after losing 4.
FULL = [
    ("a4", "a", "n0:4", "research"),
    ("a1", "a", "n1:1", "research"),
    ("b3", "b", "n1:3", "research"),
    ("b4x", "b", "n2:4", "research"),
    ("b4y", "b", "n3:4", "research"),
]

CASES = [
    Case(
        "a team short of its guarantee reclaims for a job that takes it past, from a team that borrows more",
        {"a": 6, "b": 4},
        FULL,
        [("w", "a", 4, "research")],
        preempted={"b4x"},
        nominated={"w"},
        borrowed_after={"a": 3, "b": 3},
    ),
    Case(
        "not when the team taken from would be left borrowing less than the preemptor will",
        {"a": 6, "b": 6},
        FULL,
        [("w", "a", 4, "research")],
        preempted=set(),
        nominated=set(),
    ),
    Case(
        "not for a team at its guarantee (only a team short of it goes past)",
        {"a": 5, "b": 4},
        FULL,
        [("w", "a", 4, "research")],
        preempted=set(),
        nominated=set(),
    ),
    Case(
        "only the team's smallest waiting job reclaims past the guarantee, not a wider one ahead of it",
        {"a": 6, "b": 4},
        FULL,
        [("w4", "a", 4, "research"), ("w2", "a", 2, "research")],
        preempted={"b4x"},
        nominated={"w2"},  # b's job beyond its guarantee goes first (the cost order)
    ),
    Case(
        "not from work of a higher priority than the job's (it borrows, so it takes only its peers' or lower)",
        {"a": 6, "b": 4},
        FULL,
        [("w", "a", 4, "best-effort")],
        preempted=set(),
        nominated=set(),
    ),
    Case(
        "the cohort could lend, but no node has room: the reclaim opens one",
        {"a": 6, "b": 2},
        [
            ("a4", "a", "n0:4", "research"),
            ("a1", "a", "n1:1", "research"),
            ("b2x", "b", "n1:2", "research"),
            ("b2y", "b", "n2:2", "research"),
            ("b4", "b", "n3:4", "research"),
        ],
        [("w", "a", 4, "research")],
        preempted={"b2y"},
        nominated={"w"},
        borrowed_after={"a": 3, "b": 4},
    ),
    Case(
        "a job within the unused guarantee reclaims as before (no fairness bound on the lender)",
        {"a": 9, "b": 4},
        FULL,
        [("w", "a", 4, "research")],
        preempted={"b4x"},
        nominated={"w"},
        borrowed_after={"a": 0, "b": 3},
    ),
]


def book(nominal: dict[str, int]) -> QuotaBook:
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name="default", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[
                TeamConfig(name=team, org="org", cohort="c", quotas=[TeamQuota(pool="default", nominal=n)])
                for team, n in nominal.items()
            ],
        ),
        capacity={"default": 16},
    )


def state_of(case: Case, config: SchedulerConfig | None = None) -> SchedulingState:
    used: dict[str, int] = {}
    records = []
    for job_id, team, where, priority in case.running:
        node, count = where.split(":")
        first = used.get(node, 0)
        used[node] = first + int(count)
        held = [(node, i) for i in range(first, first + int(count))]
        records.append(make_job(job_id).team(team).priority(priority).running_on(*held).started_at(0.0).build())
    for n, (job_id, team, width, priority) in enumerate(case.waiting):
        records.append(make_job(job_id).team(team).gpus(width).priority(priority).at(NOW - 100 + n).build())
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    return SchedulingState.from_snapshot(NODES, owners, {}, records, quota=book(case.nominal), config=config)


def decided(decisions: list[Decision]) -> tuple[set[str], set[str]]:
    assert not [d for d in decisions if isinstance(d, Place)], decisions
    preempted = {d.job_id for d in decisions if isinstance(d, Preempt)}
    nominated = {d.job_id for d in decisions if isinstance(d, Nominate)}
    return preempted, nominated


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_cycle_decides_as_the_table_says(case: Case) -> None:
    state = state_of(case)
    preempted, nominated = decided(state.cycle(NOW))
    assert preempted == case.preempted
    assert nominated == case.nominated
    if case.borrowed_after is not None:
        # The quota usage counts the nominated preemptors already, and the victims until they have stopped.
        for job_id in preempted:
            victim = state.running[job_id]
            state.release(job_id)
            assert victim.team != "a"
        borrowed = {t: max(0, state.usage.get((t, "default")) - n) for t, n in case.nominal.items()}
        assert borrowed == case.borrowed_after


def test_the_reason_says_the_team_goes_past_its_guarantee() -> None:
    decisions = state_of(CASES[0]).cycle(NOW)
    (nominate,) = [d for d in decisions if isinstance(d, Nominate)]
    assert "up to its guarantee (3 GPUs past it, as borrowing)" in nominate.reason
    (preempt,) = [d for d in decisions if isinstance(d, Preempt)]
    assert preempt.by == "w"


def test_off_the_team_stays_short_as_under_kueues_classic_reclaim() -> None:
    state = state_of(CASES[0], SchedulerConfig(reclaim_past_guarantee=False))
    assert decided(state.cycle(NOW)) == (set(), set())


def test_the_team_taken_from_does_not_take_back() -> None:
    """After the reclaim (the victim stopped, the preemptor started), the team taken from is still above its
    guarantee and borrows no less than the preemptor's team: when its job waits again, nobody is preempted."""
    case = CASES[0]
    state = state_of(case)
    for d in state.cycle(NOW):
        if isinstance(d, Preempt):
            state.release(d.job_id)
    state.invalidate()
    assert [d.job_id for d in state.cycle(NOW + 60) if isinstance(d, Place)] == ["w"]
    state.requeue(pending_from(make_job("b4x").team("b").gpus(4).priority("research").at(NOW).build()))
    state.invalidate()
    assert not [d for d in state.cycle(NOW + 120) if isinstance(d, Preempt)]


def test_a_job_the_quota_refuses_reclaims_and_is_never_placed_on_free_gpus_alone() -> None:
    """Found by review (115 of 3,000 random fleets): a's 4-GPU job (guarantee 3) is refused, its cohort c1 having
    nothing to lend (b borrows it all); it may reclaim past its guarantee, and the plan search found GPUs free on
    n1 and n2, c's guarantee (c lends nothing), and placed it there preempting nobody: c1 then held 12 GPUs of the
    8 it may use. Now its victims must make the room: b2 is preempted, and c1 holds 8 once it has stopped."""
    nodes = [make_node(f"n{i}").gpus(4).build() for i in range(4)]
    book = validate(QuotaConfig(
        pools=[PoolConfig(name="default", gpu_model="H100")], orgs=[OrgConfig(name="org")],
        teams=[TeamConfig(name="a", org="org", cohort="c1", quotas=[TeamQuota(pool="default", nominal=3)]),
               TeamConfig(name="b", org="org", cohort="c1", quotas=[TeamQuota(pool="default", nominal=1)]),
               TeamConfig(name="c", org="org", cohort="c2",
                          quotas=[TeamQuota(pool="default", nominal=8, lending_limit=0)])],
    ), capacity={"default": 16})  # fmt: skip
    jobs = [
        make_job("b1").team("b").priority("research").running_on(*[("n0", i) for i in range(4)]).build(),
        make_job("b2").team("b").priority("best-effort").running_on(*[("n3", i) for i in range(4)]).build(),
        make_job("a1").team("a").gpus(4).priority("best-effort").at(10).build(),
    ]
    owners = {g.slot: r.id for r in jobs if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(nodes, owners, {}, jobs, quota=book, config=SchedulerConfig())
    decisions = state.cycle(NOW)
    assert {d.job_id for d in decisions if isinstance(d, Preempt)} == {"b2"}, decisions
    nominated = [d for d in decisions if isinstance(d, Nominate)]
    assert [(d.job_id, d.victims) for d in nominated] == [("a1", ("b2/1",))], decisions
    assert not any(isinstance(d, Place) for d in decisions)
