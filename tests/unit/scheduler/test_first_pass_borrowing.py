"""Under quotas a cycle's first pass starts each job only where its team's guarantee admits it: a job that may use
several pools, within its team's guarantee in one (full) and borrowing in another, does not borrow there before
the jobs that other teams' guarantees admit in that pool have had their turn. Where it could start by borrowing
now, it is set aside and borrows in the second pass, like any borrower, if room is left; where it could not, the
first pass decides it in full, as a job its guarantee admits (reclaiming, displacing, reserving)."""

from unittest.mock import patch

import pytest

from chamber.common.contracts import JobRecord, Node, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, validate
from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt, Wait
from chamber.scheduler.core.model import pending_from
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, make_node
from tests.support.core import pure_core_only

NOW = 1000.0
NODES = [make_node("na").pool("a").gpus(8).build(), make_node("nb").pool("b").gpus(8).build()]


def book(nominal: dict[str, tuple[int, int]], capacity_b: int = 8, capacity_a: int = 8) -> QuotaBook:
    """Pools a and b (8 GPUs each on the nodes; quota capacity may be larger), one cohort that lends all: team ->
    (its guarantee in a, in b)."""
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name="a", gpu_model="H100"), PoolConfig(name="b", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[TeamConfig(name=team, org="org", cohort="c",
                              quotas=[TeamQuota(pool="a", nominal=a), TeamQuota(pool="b", nominal=b)])
                   for team, (a, b) in nominal.items()],
        ),
        capacity={"a": capacity_a, "b": capacity_b},
    )  # fmt: skip


def cycle(
    queued: list[JobRecord],
    running: list[JobRecord],
    quota: QuotaBook,
    config: SchedulerConfig | None = None,
    nodes: list[Node] = NODES,
) -> list[Decision]:
    jobs = [*running, *queued]
    owners = {g.slot: r.id for r in jobs if r.placement for g in r.placement.gpus}
    return SchedulingState.from_snapshot(nodes, owners, {}, jobs, quota=quota, config=config).cycle(NOW)


def _cycle(queued: list[JobRecord]) -> list[Decision]:
    """x is guaranteed pool a, y pool b; z borrows all of pool a, and may not be preempted yet (its minimum
    runtime): x cannot reclaim it this cycle."""
    z = (make_job("z").team("z").priority("research").pool("a").min_runtime_s(3600).started_at(NOW - 10)
         .running_on(*[("na", i) for i in range(8)]).build())  # fmt: skip
    return cycle(queued, [z], book({"x": (8, 0), "y": (0, 8), "z": (0, 0)}))


def test_a_job_guaranteed_in_a_full_pool_does_not_borrow_before_another_teams_guarantee() -> None:
    decisions = _cycle([
        make_job("x-any-pool").team("x").priority("research").gpus(4).at(1.0).build(),  # first in queue order
        make_job("y-own-pool").team("y").priority("research").gpus(8).pool("b").at(2.0).build(),
    ])  # fmt: skip
    placed = {d.job_id: {g.node for g in d.gpus} for d in decisions if isinstance(d, Place)}
    assert placed == {"y-own-pool": {"nb"}}, "y's guarantee in pool b comes before x's borrowing there"


def test_it_borrows_in_the_second_pass_when_room_is_left() -> None:
    decisions = _cycle([
        make_job("x-any-pool").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("y-own-pool").team("y").priority("research").gpus(4).pool("b").at(2.0).build(),
    ])  # fmt: skip
    placed = {d.job_id: d for d in decisions if isinstance(d, Place)}
    assert set(placed) == {"x-any-pool", "y-own-pool"}
    assert {g.node for g in placed["x-any-pool"].gpus} == {"nb"}
    assert "borrowing" in placed["x-any-pool"].reason


def cycle_with(queued: list[JobRecord], config: SchedulerConfig | None = None) -> list[Decision]:
    """x is guaranteed 4 GPUs of pool a; w 8 of pool b, which it uses with non-preemptible work (pool b's quota
    capacity is 16: 8 unassigned GPUs, so x may borrow there as far as the quota goes, though b is physically
    full). z is guaranteed nothing: it borrows all of pool a (reclaimable)."""
    running = [
        make_job("z0").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4)]).build(),
        make_job("z1").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4, 8)]).build(),
        make_job("w0").team("w").priority("train").pool("b").started_at(0.0).estimate(5000.0)
        .running_on(*[("nb", i) for i in range(8)]).build(),
    ]  # fmt: skip
    return cycle(queued, running, book({"x": (4, 0), "w": (0, 8), "z": (0, 0)}, capacity_b=16), config)


def test_a_teams_higher_priority_job_reclaims_its_guarantee_before_its_lower_priority_job() -> None:
    """Found by review of the first version of this rule, which set aside every job that would borrow somewhere.
    X1 (research, any pool) is within x's guarantee in pool a (full of z's borrowed work: reclaimable) and would
    borrow in pool b, which the quota allows but which has no GPU free. Set aside, X1 let X2 (x's best-effort job,
    pool a only, later in the queue) reclaim x's guarantee first. A job is set aside only when it could start by
    borrowing now: X1 reclaims in the first pass."""
    decisions = cycle_with([
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(2.0).build(),
    ])  # fmt: skip
    nominated = [d.job_id for d in decisions if isinstance(d, Nominate)]
    assert nominated == ["X1"], decisions


def test_a_guaranteed_reclaim_is_not_skipped_when_the_first_pass_is_cut_short() -> None:
    """Found by review. The same X1 with a budget of looks that ends the first pass before the queue does (two
    other guaranteed heads of w, blocked in b): set aside, X1 got no decision at all, as the second pass does not
    run then, every cycle while the queue kept the first pass over budget. It reclaims in the first pass."""
    decisions = cycle_with(
        [
            make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
            make_job("W1").team("w").priority("train").gpus(8).pool("b").at(2.0).build(),
            make_job("W2").team("w").priority("train").gpus(1).pool("b").at(3.0).build(),
        ],
        SchedulerConfig(max_tests_per_cycle=1, max_reservations=0),
    )  # fmt: skip
    assert "X1" in [d.job_id for d in decisions if isinstance(d, Nominate)], decisions


def test_a_job_deferred_by_the_first_pass_does_not_lose_its_reservation_to_a_later_job() -> None:
    """Found by review. Pool a is full of v's non-preemptible work (v at its guarantee there, nothing
    reclaimable); w runs a best-effort job in b (so some work is preemptible: the walk is not `_exhausted`). X1
    and then Y, both x's research 4-GPU jobs within x's guarantee in a, wait; X1 may use any pool (borrowing in b,
    quota-wise, where no GPU is free), Y only a. One reservation is allowed: X1, first in the queue, gets it (set
    aside, it lost it to Y)."""
    quota = book({"x": (4, 0), "v": (8, 0), "w": (0, 8)}, capacity_a=12, capacity_b=16)
    run = [
        make_job("v0").team("v").priority("train").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(8)]).build(),
        make_job("w0").team("w").priority("train").pool("b").started_at(0.0).estimate(5000.0)
        .running_on(*[("nb", i) for i in range(7)]).build(),
        make_job("w1").team("w").priority("best-effort").pool("b").started_at(0.0).estimate(5000.0)
        .running_on(("nb", 7)).build(),
    ]  # fmt: skip
    decisions = cycle([
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("Y").team("x").priority("research").gpus(4).pool("a").at(2.0).build(),
    ], run, quota, SchedulerConfig(max_reservations=1, order="fifo"))  # fmt: skip
    reserved = [d.job_id for d in decisions if isinstance(d, Wait) and d.why.kind == WaitKind.RESERVED]
    assert reserved == ["X1"], decisions


def test_no_room_is_opened_by_borrowing_when_the_first_pass_was_cut_short() -> None:
    """Found by review: when the budget of looks ends the first pass before the queue does, nobody borrows in the
    cycle (guaranteed heads it never reached may be owed the GPUs), and that held for the walk but not for
    consolidation after it. X1 (any pool) is within x's guarantee in pool a, full of z's work that may not be
    preempted yet, and would borrow in pool b, where no node has 4 GPUs free but moving one small job would open
    one. W1, w's guaranteed head in b, is not reached. X1 waits; no room is opened for it in b."""
    nodes = [make_node("na").pool("a").gpus(8).build(), make_node("nb").pool("b").gpus(8).build(),
             make_node("nb2").pool("b").gpus(8).build()]  # fmt: skip
    running = [
        make_job("z").team("z").priority("research").pool("a").min_runtime_s(3600).started_at(NOW - 10)
        .running_on(*[("na", i) for i in range(8)]).build(),
        *(make_job(f"m{i}").team("m").priority("research").pool("b").started_at(0.0).running_on(("nb", i)).build()
          for i in range(5)),
        make_job("n").team("n").priority("train").pool("b").started_at(0.0)
        .running_on(*[("nb2", i) for i in range(5)]).build(),
    ]  # fmt: skip
    quota = book({"x": (8, 0), "w": (0, 8), "n": (0, 5), "m": (0, 0), "z": (0, 0)}, capacity_b=16)
    queued = [
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("W1").team("w").priority("research").gpus(8).pool("b").at(2.0).build(),
    ]
    config = SchedulerConfig(max_tests_per_cycle=1, max_reservations=0, order="fifo")
    decisions = cycle(queued, running, quota, config, nodes)
    assert not [d for d in decisions if isinstance(d, Nominate | Preempt | Place)], decisions


SET_ASIDE_CASE = [
    make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
    make_job("V").team("v").priority("research").gpus(4).pool("b").at(2.0).build(),
    make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(3.0).build(),
]
"""X1 (x, any pool) first, then V (v's guarantee in b), then X2 (x's best-effort job, pool a only)."""


def _borrowed_a(busy_in_b: int) -> list[JobRecord]:
    """z borrows all of pool a (reclaimable); `busy_in_b` of pool b's 8 GPUs run w's work."""
    return [
        make_job("z0").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4)]).build(),
        make_job("z1").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4, 8)]).build(),
        *([make_job("r").team("w").priority("train").pool("b").started_at(NOW - 10).estimate(1010.0)
           .running_on(*[("nb", i) for i in range(busy_in_b)]).build()] if busy_in_b else []),
    ]  # fmt: skip


def _room_case(
    queued: list[JobRecord], *, busy_in_b: int, nominal_x: int = 4, quota: QuotaBook | None = None
) -> list[Decision]:
    """`_borrowed_a`, x guaranteed `nominal_x` GPUs of pool a, v and w 4 each of pool b (quota capacity 16)."""
    quota = quota or book({"x": (nominal_x, 0), "v": (0, 4), "w": (0, 4), "z": (0, 0)}, capacity_b=16)
    return cycle(queued, _borrowed_a(busy_in_b), quota, SchedulerConfig(order="fifo"))


def moved(decisions: list[Decision]) -> dict[str, str]:
    return {d.job_id: type(d).__name__ for d in decisions if isinstance(d, Nominate | Place)}


def test_a_job_set_aside_keeps_its_teams_guarantee_from_its_teams_later_jobs() -> None:
    """Found by review (2026-12-05). X1 (x, research, any pool) is within
    x's guarantee in pool a, which z fills by borrowing (reclaimable), and could borrow pool b's 4 free GPUs now:
    the first pass sets it aside. V, which v's guarantee admits in b, comes later in the queue and takes those
    GPUs in the first pass, as it should. X2, x's best-effort job (pool a only), came after it and reclaimed x's
    guarantee in a; X1 then found nothing in the second pass. Now X1 is decided in full as soon as V took its room
    (before X2's turn): X1 reclaims, X2 waits. (A fix that set aside the team's later jobs using that guarantee was
    tried before and dropped: a review showed six cases it made worse.)"""
    decisions = _room_case(SET_ASIDE_CASE, busy_in_b=4)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


def test_a_set_aside_job_keeps_waiting_for_the_second_pass_while_its_room_is_left() -> None:
    """V takes 4 of pool b's 8 free GPUs: X1's 4 are still there, so X1 stays set aside and borrows them in the
    second pass (it is not decided again only because some GPUs were taken)."""
    decisions = _room_case(SET_ASIDE_CASE[:2], busy_in_b=0)
    placed = {d.job_id: d for d in decisions if isinstance(d, Place)}
    assert set(placed) == {"X1", "V"}, decisions
    assert "borrowing" in placed["X1"].reason
    assert not [d for d in decisions if isinstance(d, Nominate | Preempt)], decisions


def test_a_set_aside_job_whose_room_the_last_guaranteed_job_took_reclaims_in_the_second_pass() -> None:
    """V, the first pass's last job, takes the room X1 would borrow: nothing of x's took its guarantee since, and
    the second pass decides X1 in full (it reclaims pool a)."""
    decisions = _room_case(SET_ASIDE_CASE[:2], busy_in_b=4)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


def test_the_next_head_of_a_set_aside_jobs_sub_queue_comes_before_the_teams_later_job() -> None:
    """Found by review of the fix. X1 and X1b (x's research jobs, any pool, one sub-queue; x is guaranteed 8 GPUs
    of pool a, all of which z borrows): X1 is set aside, V takes its room. X1 is decided before X2 is even taken
    from the walk, so X1b, next in its sub-queue and earlier in the queue than X2, reclaims too; X2 waits."""
    queued = [
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("X1b").team("x").priority("research").gpus(4).at(1.5).build(),
        make_job("V").team("v").priority("research").gpus(4).pool("b").at(2.0).build(),
        make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(3.0).build(),
    ]
    decisions = _room_case(queued, busy_in_b=4, nominal_x=8)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate", "X1b": "Nominate"}, decisions


def _pinned_a() -> list[JobRecord]:
    """z fills pool a and may not be preempted yet (its minimum runtime); w runs 4 of pool b's 8 GPUs."""
    return [
        make_job("z").team("z").priority("research").pool("a").min_runtime_s(3600).started_at(NOW - 10)
        .running_on(*[("na", i) for i in range(8)]).build(),
        make_job("r").team("w").priority("train").pool("b").started_at(NOW - 10).estimate(1010.0)
        .running_on(*[("nb", i) for i in range(4)]).build(),
    ]  # fmt: skip


@pure_core_only
def test_a_set_aside_job_decided_late_joins_the_consolidation_list_at_its_turn() -> None:
    """Found by review of the fix. X1 is set aside; Y (y's guarantee in b, 8 GPUs) is blocked, joins the list of
    jobs room may be opened for and reserves the node X1 would borrow on; X1, decided then, joins that list before
    Y (its turn came first): `consolidate` opens room in turn order."""
    seen: list[list[str]] = []
    original = _Cycle.consolidate

    def spy(self: _Cycle, decisions: list[Decision]) -> None:
        seen.append([job.id for _, job in self.ctx.to_consolidate])
        original(self, decisions)

    running = _pinned_a()
    queued = [
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("Y").team("y").priority("research").gpus(8).pool("b").at(2.0).build(),
        make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(3.0).build(),
    ]
    quota = book({"x": (4, 0), "y": (0, 8), "w": (0, 4), "z": (0, 0)}, capacity_b=16)
    with patch.object(_Cycle, "consolidate", spy):
        cycle(queued, running, quota, SchedulerConfig(order="fifo"))
    assert seen, "consolidate ran"
    assert seen[0][:2] == ["X1", "Y"], seen


def _three_pools(teams: dict[str, tuple[int, int, int]], capacity: tuple[int, int, int]) -> QuotaBook:
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name=p, gpu_model="H100") for p in "abc"],
            orgs=[OrgConfig(name="org")],
            teams=[TeamConfig(name=team, org="org", cohort="c",
                              quotas=[TeamQuota(pool=p, nominal=n) for p, n in zip("abc", nominal, strict=True)])
                   for team, nominal in teams.items()],
        ),
        capacity=dict(zip("abc", capacity, strict=True)),
    )  # fmt: skip


def test_room_taken_while_set_aside_jobs_are_decided_is_looked_at_again() -> None:
    """Found by review of the fix. X1 (x, 4 GPUs, any pool) is set aside with 4 GPUs free on nb1 to borrow; X3 (u,
    8 GPUs, any pool, guaranteed in b where no node has 8 free) is set aside with pool c's 8 to borrow. V takes
    pool c: X3, decided then, reserves nb1, which holds X1's room too. X1 is looked at again and reclaims; X2 waits."""
    nodes = [make_node("na").pool("a").gpus(8).build(), make_node("nb1").pool("b").gpus(8).build(),
             make_node("nb2").pool("b").gpus(8).build(), make_node("nc").pool("c").gpus(8).build()]  # fmt: skip
    running = [
        make_job("z0").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4)]).build(),
        make_job("z1").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4, 8)]).build(),
        make_job("r").team("w").priority("train").pool("b").started_at(NOW - 10).estimate(1010.0)
        .running_on(*[("nb1", i) for i in range(4)]).build(),
        make_job("r2").team("w").priority("train").pool("b").started_at(NOW - 10).estimate(5000.0)
        .running_on(*[("nb2", i) for i in range(8)]).build(),
    ]  # fmt: skip
    quota = _three_pools(
        {"x": (4, 0, 0), "u": (0, 8, 0), "w": (0, 12, 0), "v": (0, 0, 8), "z": (0, 0, 0)}, capacity=(8, 32, 8)
    )
    queued = [
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("X3").team("u").priority("research").gpus(8).at(2.0).build(),
        make_job("V").team("v").priority("research").gpus(8).pool("c").at(3.0).build(),
        make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(4.0).build(),
    ]
    decisions = cycle(queued, running, quota, SchedulerConfig(order="fifo"), nodes)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


W_LENDS_NOTHING = validate(
    QuotaConfig(
        pools=[PoolConfig(name="a", gpu_model="H100"), PoolConfig(name="b", gpu_model="H100")],
        orgs=[OrgConfig(name="org")],
        teams=[TeamConfig(name="x", org="org", cohort="c", quotas=[TeamQuota(pool="a", nominal=4)]),
               TeamConfig(name="v", org="org", cohort="c", quotas=[TeamQuota(pool="b", nominal=4)]),
               TeamConfig(name="w", org="org", cohort="c", quotas=[TeamQuota(pool="b", nominal=4, lending_limit=0)]),
               TeamConfig(name="z", org="org", cohort="c", quotas=[])],
    ),
    capacity={"a": 8, "b": 8},
)  # fmt: skip
"""x guaranteed 4 GPUs of pool a, v and w 4 each of pool b, where w lends nothing: x may borrow v's 4 only."""


def test_a_set_aside_job_whose_lending_a_guaranteed_job_took_keeps_its_teams_guarantee() -> None:
    """Pool b's 8 GPUs are all free; x may borrow 4 there (v's idle guarantee: w, guaranteed the other 4, lends
    nothing). X1 is set aside; V takes v's guarantee: x may borrow nothing more in b, though w's 4 GPUs stay free.
    X1 is looked at again once the quota usage changed, and decided before X2 takes x's guarantee (found by
    review of the first fix, which looked at the GPUs only)."""
    decisions = _room_case(SET_ASIDE_CASE, busy_in_b=0, quota=W_LENDS_NOTHING)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


def test_a_set_aside_job_whose_lending_a_reclaim_took_keeps_its_teams_guarantee() -> None:
    """Pool b: nb1's 4 GPUs run z's borrowed work, nb2 has 2 of w's and 2 free; x may borrow 2 there, so X1 (2 GPUs)
    is set aside. V (v's guarantee in b, 4 GPUs on one node) reclaims nb1 (nominated): x's cohort then lends
    nothing in b though no GPU was taken; the nomination counts in the quota usage, so X1 is looked at again."""
    nodes = [make_node("na").pool("a").gpus(8).build(), make_node("nb1").pool("b").gpus(4).build(),
             make_node("nb2").pool("b").gpus(4).build()]  # fmt: skip
    running = [
        make_job("z0").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4)]).build(),
        make_job("z1").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[("na", i) for i in range(4, 8)]).build(),
        make_job("zb").team("z").priority("research").pool("b").started_at(0.0).estimate(3000.0)
        .running_on(*[("nb1", i) for i in range(4)]).build(),
        make_job("w0").team("w").priority("train").pool("b").started_at(0.0).estimate(5000.0)
        .running_on(("nb2", 0), ("nb2", 1)).build(),
    ]  # fmt: skip
    queued = [
        make_job("X1").team("x").priority("research").gpus(2).at(1.0).build(),
        make_job("V").team("v").priority("research").gpus(4).pool("b").at(2.0).build(),
        make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(3.0).build(),
    ]
    quota = book({"x": (4, 0), "v": (0, 4), "w": (0, 2), "z": (0, 0)})
    decisions = cycle(queued, running, quota, SchedulerConfig(order="fifo"), nodes)
    assert moved(decisions) == {"V": "Nominate", "X1": "Nominate"}, decisions


SIBLINGS = [
    make_job("XH").team("x").priority("research").gpus(2).at(1.0).build(),
    make_job("XL").team("x").priority("best-effort").gpus(4).at(2.0).build(),
]
"""Two jobs of x that may use any pool, both set aside to borrow in b: the higher-priority one asks for less."""


@pytest.mark.xfail(strict=True, reason="known: of two set-aside jobs of a team, the one that loses its room first is "
                   "decided first, though the other comes before it")  # fmt: skip
@pytest.mark.parametrize("lost", ["lending", "gpus"])
def test_of_two_set_aside_jobs_of_a_team_the_earlier_keeps_its_teams_guarantee(lost: str) -> None:
    """KNOWN GAP (found by differential fuzzing of the lending fix; the GPU form was there before it). XH and XL
    are set aside with room to borrow in b; V1 takes enough of it (the lending, or the GPUs) that XL, asking for
    more, has none left, and XL is decided in full: it takes x's guarantee in a. V2 takes the rest, and XH, before
    XL in the queue and of higher priority, finds the guarantee gone. Looking at the team's earlier set-aside
    jobs first would give XH the guarantee; tried as "XL waits while XH is set aside", XL would lose it to a later
    job of the team instead, so it is left as it is."""
    if lost == "lending":
        quota = W_LENDS_NOTHING
        rest = [make_job("V1").team("v").priority("best-effort").gpus(2).pool("b").at(3.0).build(),
                make_job("V2").team("v").priority("best-effort").gpus(2).pool("b").at(4.0).build()]  # fmt: skip
    else:
        quota = book({"x": (4, 0), "v": (0, 8), "z": (0, 0)}, capacity_b=16)
        rest = [make_job("V1").team("v").priority("best-effort").gpus(6).pool("b").at(3.0).build(),
                make_job("V2").team("v").priority("best-effort").gpus(2).pool("b").at(4.0).build()]  # fmt: skip
    decisions = cycle([*SIBLINGS, *rest], _borrowed_a(0), quota, SchedulerConfig(order="fifo"))
    assert moved(decisions) == {"V1": "Place", "V2": "Place", "XH": "Nominate"}, decisions


def test_a_head_decided_when_its_room_went_counts_against_the_cycles_budget_of_looks() -> None:
    """Found by review: the head `_room_gone` decided took the budget's last look, and the walk still took the
    next item (three looks with a budget of two)."""
    for busy_in_b, quota in ((4, book({"x": (4, 0), "v": (0, 4), "w": (0, 4), "z": (0, 0)}, capacity_b=16)),
                             (0, W_LENDS_NOTHING)):  # fmt: skip
        jobs = [*_borrowed_a(busy_in_b), *SET_ASIDE_CASE]
        owners = {g.slot: r.id for r in jobs if r.placement for g in r.placement.gpus}
        config = SchedulerConfig(order="fifo", max_tests_per_cycle=2)
        state = SchedulingState.from_snapshot(NODES, owners, {}, jobs, quota=quota, config=config)
        decisions = state.cycle(NOW)
        assert state.ctx is not None
        assert state.ctx.tests == 2
        assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


def _arrive(
    running: list[JobRecord], quota: QuotaBook, records: list[JobRecord], config: SchedulerConfig | None = None
) -> list[Decision]:
    """`records` arriving together after a cycle on `running`, decided against it (`decide_arrivals`)."""
    owners = {g.slot: r.id for r in running if r.placement for g in r.placement.gpus}
    config = config or SchedulerConfig(order="fifo")
    state = SchedulingState.from_snapshot(NODES, owners, {}, running, quota=quota, config=config)
    state.cycle(NOW)
    for record in records:
        state.add(pending_from(record))
    return state.decide(NOW + 1)


def test_arrivals_set_aside_keep_their_teams_guarantee() -> None:
    """Found by review of the fix. The three jobs of the first case above, arriving together after a cycle and
    decided against it (`decide_arrivals`): X1, set aside, is decided in full once V took its room, before X2
    takes x's guarantee (before, X2 took it and X1 waited)."""
    quota = book({"x": (4, 0), "v": (0, 4), "w": (0, 4), "z": (0, 0)}, capacity_b=16)
    decisions = _arrive(_borrowed_a(4), quota, SET_ASIDE_CASE)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


def test_an_arrival_set_aside_whose_lending_an_earlier_arrival_took_keeps_its_teams_guarantee() -> None:
    """The lending case above, the jobs arriving together: V takes v's guarantee, which x would have borrowed, and
    X1 is decided in full before X2 takes x's guarantee (pool b's GPUs all stay free)."""
    decisions = _arrive(_borrowed_a(0), W_LENDS_NOTHING, SET_ASIDE_CASE)
    assert moved(decisions) == {"V": "Place", "X1": "Nominate"}, decisions


def test_a_set_aside_job_may_still_backfill_by_borrowing_into_the_reservation_that_took_its_room() -> None:
    """Found by a second review of the fix. X1 (x, any pool, 500 s) is set aside with nb's 4 free GPUs to borrow;
    Y (y's guarantee in b, 8 GPUs) is blocked and reserves nb, which starts in ~1,000 s. X1 ends before that: it
    stays set aside, and the second pass backfills it there by borrowing (decided in full in the first pass, it
    could not borrow, and the GPUs stayed idle)."""
    running = _pinned_a()
    queued = [
        make_job("X1").team("x").priority("research").gpus(4).estimate(500.0).at(1.0).build(),
        make_job("Y").team("y").priority("research").gpus(8).pool("b").at(2.0).build(),
    ]
    quota = book({"x": (4, 0), "y": (0, 8), "w": (0, 4), "z": (0, 0)}, capacity_b=16)
    decisions = cycle(queued, running, quota, SchedulerConfig(order="fifo"))
    assert moved(decisions) == {"X1": "Place"}, decisions


def test_set_aside_jobs_decided_when_their_room_is_gone_stay_within_the_budget_of_looks() -> None:
    """Found by a second review of the fix: ten teams' jobs are set aside with pool b's 8 free GPUs to borrow, and
    V takes them. Deciding them then counts against the cycle's budget of looks (4 here) like any head."""
    teams = [f"x{i}" for i in range(10)]
    nodes = [
        *(make_node(f"na{i}").pool("a").gpus(8).build() for i in range(10)),
        make_node("nb").pool("b").gpus(8).build(),
    ]
    running = [
        make_job(f"z{i}").team("z").priority("research").pool("a").started_at(0.0).estimate(3000.0)
        .running_on(*[(f"na{i}", k) for k in range(8)]).build()
        for i in range(10)
    ]  # fmt: skip
    queued = [
        make_job(f"X{i}").team(team).priority("research").gpus(8).at(float(i)).build() for i, team in enumerate(teams)
    ]
    queued.append(make_job("V").team("v").priority("research").gpus(8).pool("b").at(10.0).build())
    quota = validate(
        QuotaConfig(
            pools=[PoolConfig(name="a", gpu_model="H100"), PoolConfig(name="b", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[*(TeamConfig(name=t, org="org", cohort="c", quotas=[TeamQuota(pool="a", nominal=8)]) for t in teams),
                   TeamConfig(name="v", org="org", cohort="c", quotas=[TeamQuota(pool="b", nominal=8)]),
                   TeamConfig(name="z", org="org", cohort="c", quotas=[])],
        ),
        capacity={"a": 80, "b": 16},
    )  # fmt: skip
    jobs = [*running, *queued]
    owners = {g.slot: r.id for r in jobs if r.placement for g in r.placement.gpus}
    config = SchedulerConfig(order="fifo", max_tests_per_cycle=4)
    state = SchedulingState.from_snapshot(nodes, owners, {}, jobs, quota=quota, config=config)
    decisions = state.cycle(NOW)
    assert state.ctx is not None
    assert state.ctx.tests <= 4, (state.ctx.tests, decisions)
    assert "V" in moved(decisions), decisions


def test_an_arrival_set_aside_may_still_backfill_by_borrowing_into_the_reservation_that_took_its_room() -> None:
    """The backfill case above with its jobs arriving after a cycle (`decide_arrivals`), and x's best-effort X2
    after them (so X1 is looked at again before X2 is decided): X1 stays set aside and is backfilled by
    borrowing."""
    quota = book({"x": (4, 0), "y": (0, 8), "w": (0, 4), "z": (0, 0)}, capacity_b=16)
    decisions = _arrive(_pinned_a(), quota, [
        make_job("X1").team("x").priority("research").gpus(4).estimate(500.0).at(1.0).build(),
        make_job("Y").team("y").priority("research").gpus(8).pool("b").at(2.0).build(),
        make_job("X2").team("x").priority("best-effort").gpus(4).pool("a").at(3.0).build(),
    ])  # fmt: skip
    assert moved(decisions) == {"X1": "Place"}, decisions


def test_an_arrival_set_aside_again_keeps_its_place_among_the_later_ones() -> None:
    """Found by review of the arrivals fix. X1 (x, any pool) is set aside; U (a borrower, any pool) after it; X0
    (x's train job, pool a) takes x's guarantee; V takes pool b's room. X1, decided in full then, is set aside
    again (only borrowing admits it now): it keeps its place before U, so it gets the one reservation."""
    quota = book({"x": (4, 0), "u": (0, 0), "v": (0, 4), "w": (0, 4), "z": (0, 0)}, capacity_b=16)
    decisions = _arrive(_borrowed_a(4), quota, [
        make_job("X1").team("x").priority("research").gpus(4).at(1.0).build(),
        make_job("U").team("u").priority("research").gpus(4).at(1.5).build(),
        make_job("X0").team("x").priority("train").gpus(4).pool("a").at(1.7).build(),
        make_job("V").team("v").priority("research").gpus(4).pool("b").at(2.0).build(),
        make_job("Q").team("q").priority("best-effort").gpus(1).pool("a").at(3.0).build(),
    ], SchedulerConfig(order="fifo", max_reservations=1))  # fmt: skip
    reserved = [d.job_id for d in decisions if isinstance(d, Wait) and d.why.kind == WaitKind.RESERVED]
    assert reserved == ["X1"], decisions
