"""Parked quota groups and the second pass. A group whose heads its team's quota admits only by borrowing is not
woken in the first pass; it has its turn again in the second, where borrowers are decided in queue order. That
turn must come no later than its first head's: a head's order moves while its group is parked (it ages, for
one), and a group looked at in its old place let later borrowers take what the cohort had to lend first."""

from unittest.mock import patch

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import validate
from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Nominate, Place, Preempt, Wait
from chamber.scheduler.core.model import PendingJob, pending_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.queue import Entry, Walk
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, make_node, pool_quota
from tests.support.core import pure_core_only

MAX_WAIT = 3600.0


def test_an_aged_borrower_in_a_parked_group_borrows_before_a_later_one() -> None:
    # Cohort c at its guarantee has nothing to lend; w's two idle GPUs are lent only within cohort d.
    quota = pool_quota(6, ("x", "c", 1, None), ("y", "c", 1, None), ("z", "c", 2, None), ("w", "d", 2, None))
    records = [
        make_job(f"{team}-running{i}").team(team).priority("research").running_on(("n0", gpu)).started_at(0.0).build()
        for gpu, (team, i) in enumerate((("x", 0), ("y", 0), ("z", 0), ("z", 1)))
    ]
    records += [
        make_job("y-waits").team("y").priority("research").at(100.0).build(),
        make_job("x-waits").team("x").priority("research").at(200.0).build(),
    ]
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot([make_node("n0").gpus(6).build()], owners, {}, records,
                                          config=SchedulerConfig(max_wait_s=MAX_WAIT))  # fmt: skip
    state.set_quota(quota, standing={"x": 1.0, "y": 0.0})  # x's standing orders its jobs first
    first = {d.job_id: d.why.kind for d in state.cycle(1000.0) if isinstance(d, Wait)}
    assert first == {"x-waits": WaitKind.QUOTA, "y-waits": WaitKind.QUOTA}  # both groups parked
    state.release("z-running0")  # team z lends one GPU
    decisions = state.cycle(100.0 + MAX_WAIT + 1)  # y's job has waited past max_wait: it goes first
    assert [d.job_id for d in decisions if isinstance(d, Place)] == ["y-waits"]


def test_an_arrival_after_a_cycle_without_a_second_pass_may_borrow() -> None:
    """Arrivals decided against the last cycle's conclusions come after both its passes, also when nothing was set
    aside for a second one: a job only borrowing admits is placed at once (it used to get no decision at all, and
    not even parked, until the next full cycle)."""
    state = SchedulingState()
    for i in range(3):
        state.index.add_node(f"n{i}", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(16, ("t", "c", 4, 0), ("u", "c", 4, None), ("lender", "c", 8, None)))
    for job in (
        make_job("t-base").team("t").priority("inference").gpus(4).build(),
        make_job("u-base").team("u").priority("inference").gpus(4).build(),
        make_job("lender-base").team("lender").priority("inference").gpus(5).build(),
    ):
        state.add(pending_from(job))
    assert len([d for d in state.cycle(1.0) if isinstance(d, Place)]) == 3  # the lender lends its 3 idle GPUs
    state.add(pending_from(make_job("t-more").team("t").priority("research").at(2.0).build()))
    state.cycle(2.0)  # t may not borrow (limit 0): parked
    assert state.cycle(3.0) == []  # nothing to set aside for a second pass
    decisions = state.submit(pending_from(make_job("u-more").team("u").priority("research").at(4.0).build()), 4.0)
    assert [(type(d), d.job_id) for d in decisions] == [(Place, "u-more")]


def test_an_arrival_does_not_borrow_ahead_of_guaranteed_heads_a_cut_first_pass_never_reached() -> None:
    """A first pass cut short by `max_tests_per_cycle` leaves guaranteed heads undecided: an arrival only borrowing
    admits must not take their GPUs before they have had their turn (found by review)."""
    state = SchedulingState(config=SchedulerConfig(max_tests_per_cycle=1))
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(8, ("g", "c", 4, None), ("b", "c", 0, None), ("lender", "c", 4, None)))
    state.add(pending_from(make_job("g-first").team("g").priority("inference").gpus(2).at(1.0).build()))
    state.add(pending_from(make_job("g-second").team("g").priority("research").gpus(2).at(1.0).build()))
    placed = [d.job_id for d in state.cycle(2.0) if isinstance(d, Place)]
    assert placed == ["g-first"]  # the budget of one head ends the walk: g-second (guaranteed, fits) not looked at
    borrower = make_job("b-more").team("b").priority("research").gpus(6).at(3.0).build()
    decisions = state.submit(pending_from(borrower), 3.0)
    assert [d.job_id for d in decisions if isinstance(d, Place)] == []  # borrowing waits for the guarantees
    assert [d.why.kind for d in decisions if isinstance(d, Wait)] == [WaitKind.QUOTA]  # and says so


def test_arrivals_decided_together_give_the_guaranteed_one_its_turn_before_the_borrower() -> None:
    """Arrivals decided in one batch against the last cycle's context (the scheduler decides up to 256 events at
    once) are ordered as the cycle's two passes order heads: the one its team's guarantee admits before the one only
    borrowing admits, which would otherwise take the GPUs first (found by review)."""
    state = SchedulingState()
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(8, ("g", "c", 4, None), ("b", "c", 0, None), ("lender", "c", 4, None)))
    assert state.cycle(1.0) == []  # nothing waits: the context holds, no second pass
    state.add(pending_from(make_job("b-borrows").team("b").priority("research").gpus(6).at(2.0).build()))
    state.add(pending_from(make_job("g-guaranteed").team("g").priority("research").gpus(4).at(2.0).build()))
    placed = [d.job_id for d in state.decide(2.0) if isinstance(d, Place)]
    assert "g-guaranteed" in placed  # within its guarantee, on GPUs that were free


def _lent_to_b(**config: object) -> SchedulingState:
    """Team b has no guarantee; its cohort-mate lends all 8 GPUs of the one node."""
    state = SchedulingState(config=SchedulerConfig(**config))  # type: ignore[arg-type]
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(8, ("b", "c", 0, None), ("lender", "c", 8, None)))
    assert state.cycle(1.0) == []
    return state


def test_borrowers_of_one_sub_queue_arriving_together_are_all_decided_as_a_cycle_would() -> None:
    """A sweep: jobs of one team, priority and shape arriving in one batch share a sub-queue. The first is set aside
    for the borrowing pass and stays its head; the ones behind it follow it there, not 'queued behind' it until the
    next cycle (found by review). Each arrival gets exactly one decision."""
    state = _lent_to_b()
    for i in range(5):
        state.add(pending_from(make_job(f"b-{i}").team("b").priority("research").gpus(2).at(2.0).build()))
    decisions = state.decide(2.0)
    assert sorted(d.job_id for d in decisions if isinstance(d, Place)) == ["b-0", "b-1", "b-2", "b-3"]
    assert sorted(d.job_id for d in decisions) == ["b-0", "b-1", "b-2", "b-3", "b-4"]  # b-4: no room left


def test_a_first_pass_that_looked_at_every_head_within_the_budget_was_not_cut_short() -> None:
    """One head and a budget of one: the walk saw every head, so arrivals may borrow after it (found by review)."""
    state = SchedulingState(config=SchedulerConfig(max_tests_per_cycle=1))
    state.index.add_node("n0", pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(8, ("g", "c", 4, None), ("b", "c", 0, None), ("lender", "c", 4, None)))
    state.add(pending_from(make_job("g-only").team("g").priority("research").gpus(2).at(1.0).build()))
    assert [d.job_id for d in state.cycle(2.0) if isinstance(d, Place)] == ["g-only"]
    more = make_job("b-more").team("b").priority("research").gpus(2).at(3.0).build()
    assert [d.job_id for d in state.submit(pending_from(more), 3.0) if isinstance(d, Place)] == ["b-more"]


def cohort_lending(one_gpu: bool) -> tuple[SchedulingState, list[Place]]:
    """Cohort c (x, y, z, at their guarantees of 2) borrows from the pool's 4 unassigned GPUs; w, in cohort d with
    no guarantee, borrows all 4. x waits with a 2-GPU job, y with a 1-GPU one (or, without `one_gpu`, a 2-GPU one),
    z with a 2-GPU one: all are refused and parked. Then one of w's jobs ends: c may borrow 1 GPU again."""
    quota = pool_quota(10, ("x", "c", 2, None), ("y", "c", 2, None), ("z", "c", 2, None), ("w", "d", 0, None))
    teams = [(t, i) for t in "xyz" for i in range(2)] + [("w", i) for i in range(4)]
    records = [
        make_job(f"{team}-running{i}").team(team).priority("research").running_on(("n0", gpu)).started_at(0.0).build()
        for gpu, (team, i) in enumerate(teams)
    ]
    records += [
        make_job("x-waits").team("x").priority("research").gpus(2).at(100.0).build(),
        make_job("y-waits").team("y").priority("research").gpus(1 if one_gpu else 2).at(200.0).build(),
        make_job("z-waits").team("z").priority("research").gpus(2).at(300.0).build(),
    ]
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot([make_node("n0").gpus(10).build()], owners, {}, records)
    state.set_quota(quota)
    assert not [d for d in state.cycle(1000.0) if isinstance(d, Place)]
    assert {group[0] for group in state.queue.parked} == {"x", "y", "z"}
    state.release("w-running0")
    return state, [d for d in state.cycle(1100.0) if isinstance(d, Place)]


def test_a_group_the_cohort_cannot_lend_enough_for_leaves_the_cohorts_later_groups_their_turn() -> None:
    """x's group comes first and wakes nothing (1 GPU to lend, its job asks for 2); y's group, of the same cohort,
    still has its turn: its 1-GPU job borrows the GPU."""
    _, placed = cohort_lending(one_gpu=True)
    assert [d.job_id for d in placed] == ["y-waits"]


@pure_core_only
def test_once_a_cohort_lends_nothing_more_its_later_groups_are_not_looked_at() -> None:
    """When the cohort has nothing left to lend, no later group of its teams at their guarantee can wake in the
    cycle (what it may borrow only shrinks): once a group finds that, the second pass looks at no more of them
    (`Walk.close`)."""
    state, _ = cohort_lending(one_gpu=False)
    state.release("w-running1")  # c may borrow 2: x's 2-GPU job takes both, y's group wakes nothing after it
    looked: list[tuple[str, str, bool, int]] = []
    wake = _Cycle._wake_in_turn

    def counting(self: _Cycle, group: tuple[str, str, bool, int], room: int, popped: Entry, heads: Walk) -> None:
        looked.append(group)
        wake(self, group, room, popped, heads)

    with patch.object(_Cycle, "_wake_in_turn", counting):
        placed = [d.job_id for d in state.cycle(1200.0) if isinstance(d, Place)]
    assert placed == ["x-waits"]
    assert [group[0] for group in looked] == ["x", "y"]


def test_a_job_that_would_borrow_elsewhere_gets_nothing_before_the_borrowers_ahead_of_it() -> None:
    """Found by review, when the first pass still let a job borrow. T's 1-GPU job in p0 waits parked (cohort c lends
    nothing there). In the next cycle T's best-effort job J may use p1 (within T's guarantee, but full: V borrows
    it) or p0 (borrowing). J used to be placed in p0 in the first pass, by borrowing, ahead of U's and T's
    research jobs waiting to borrow there (and T's group then had to leave its cohort's lane). Now the first pass
    gives J only what T's guarantee admits, nothing, and the second pass lends p0's two free GPUs in queue order:
    to U's and T's research jobs (a budget of two head looks ends the cycle there); J neither borrows before them
    nor preempts V for what it could borrow."""
    pools = {"p0": 4, "p1": 2, "p2": 1}
    teams = [("T", "c", {"p0": 1, "p1": 2}), ("U", "c", {"p0": 1}), ("L", "c", {"p0": 2}), ("V", "c", {}),
             ("W", "w", {})]  # fmt: skip
    config = QuotaConfig(
        pools=[PoolConfig(name=p, gpu_model="H100") for p in pools], orgs=[OrgConfig(name="org")],
        teams=[TeamConfig(name=name, org="org", cohort=cohort,
                          quotas=[TeamQuota(pool=p, nominal=n) for p, n in nominal.items()])
               for name, cohort, nominal in teams],
    )  # fmt: skip
    state = SchedulingState(SchedulerConfig(max_tests_per_cycle=2))
    for pool, gpus in pools.items():
        state.index.add_node(f"{pool}-n", pool=pool, model="H100", rack="r", zone="z", capacity=gpus, free=range(gpus))
    state.set_quota(validate(config, capacity=pools))

    def job(job_id: str, team: str, cls: str, gpus: int, pool: str | None, *, at: float = 0.0) -> PendingJob:
        built = make_job(job_id).team(team).priority(cls).gpus(gpus).at(at)
        return pending_from((built.pool(pool) if pool else built).build())

    for running in (job("A", "T", "research", 1, "p0"), job("B", "U", "inference", 1, "p0"),
                    job("L1", "L", "inference", 1, "p0"), job("L2", "L", "inference", 1, "p0"),
                    job("V1", "V", "research", 2, "p1")):  # fmt: skip
        state.place(running, find_placement(state.index, running.shape) or (), "running", 0.0, borrowing=False)
    state.mark_borrowed()
    state.add(job("U-wait", "U", "research", 1, "p0", at=10.0))
    state.add(job("T-wait", "T", "research", 1, "p0", at=11.0))
    assert not [d for d in state.cycle(100.0) if isinstance(d, Place)]
    state.release("L1")
    state.release("L2")
    state.add(job("J", "T", "best-effort", 2, None, at=20.0))
    state.add(job("Z", "W", "best-effort", 1, "p2", at=21.0))
    decisions = state.cycle(200.0)
    assert [d.job_id for d in decisions if isinstance(d, Place)] == ["U-wait", "T-wait"]
    assert not [d for d in decisions if isinstance(d, Preempt | Nominate)]
