"""Under quotas a cycle's first pass gives each job only what its team's guarantee admits: a job that may use
several pools, within its team's guarantee in one (full) and borrowing in another, does not borrow there before
the jobs that other teams' guarantees admit in that pool have had their turn. It borrows in the second pass, like
any borrower, if room is left."""

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, validate
from chamber.scheduler.core.decisions import Decision, Place
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import make_job, make_node

NOW = 1000.0
NODES = [make_node("na").pool("a").gpus(8).build(), make_node("nb").pool("b").gpus(8).build()]


def book() -> QuotaBook:
    """x is guaranteed 8 GPUs of pool a, y 8 of pool b; z nothing (it borrows). One cohort lends all."""
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name="a", gpu_model="H100"), PoolConfig(name="b", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[
                TeamConfig(name="x", org="org", cohort="c",
                           quotas=[TeamQuota(pool="a", nominal=8), TeamQuota(pool="b", nominal=0)]),
                TeamConfig(name="y", org="org", cohort="c",
                           quotas=[TeamQuota(pool="a", nominal=0), TeamQuota(pool="b", nominal=8)]),
                TeamConfig(name="z", org="org", cohort="c",
                           quotas=[TeamQuota(pool="a", nominal=0), TeamQuota(pool="b", nominal=0)]),
            ],
        ),
        capacity={"a": 8, "b": 8},
    )  # fmt: skip


def _cycle(queued: list) -> list[Decision]:  # type: ignore[type-arg]
    # z borrows all of pool a, and may not be preempted yet (its minimum runtime): x cannot reclaim it this cycle.
    z = (make_job("z").team("z").priority("research").pool("a").min_runtime_s(3600).started_at(NOW - 10)
         .running_on(*[("na", i) for i in range(8)]).build())  # fmt: skip
    jobs = [z, *queued]
    owners = {g.slot: r.id for r in jobs if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(NODES, owners, {}, jobs, quota=book())
    return state.cycle(NOW)


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
