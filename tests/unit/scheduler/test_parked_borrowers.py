"""Parked quota groups and the second pass. A group whose heads its team's quota admits only by borrowing is not
woken in the first pass; it has its turn again in the second, where borrowers are decided in queue order. That
turn must come no later than its first head's: a head's order moves while its group is parked (it ages, for
one), and a group looked at in its old place let later borrowers take what the cohort had to lend first."""

from chamber.scheduler.core.decisions import Place, Wait
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, make_node, pool_quota

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
