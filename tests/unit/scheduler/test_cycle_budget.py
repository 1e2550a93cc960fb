"""The cycle's test budget (`max_tests_per_cycle`) bounds the heads a cycle decides in full. Under quotas the
first pass only sets borrowers aside (their turn is the second pass, after every job a guarantee admits): setting
a head aside must not spend the budget, or a queue with more borrowing heads than the budget never borrows at
all, however idle the fleet (seen in `chamber bench scheduler --quota`: 1,000 teams, no job borrowed after the
second cycle)."""

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, validate
from chamber.scheduler.core.decisions import Place
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job, make_node

NOW = 10_000.0
NODES = [make_node(f"n{i}").gpus(4).build() for i in range(4)]  # 16 idle GPUs in pool "default"


def book(teams: int) -> QuotaBook:
    return validate(
        QuotaConfig(
            pools=[PoolConfig(name="default", gpu_model="H100")],
            orgs=[OrgConfig(name="org")],
            teams=[
                TeamConfig(name=f"t{i}", org="org", cohort="c", quotas=[TeamQuota(pool="default", nominal=1)])
                for i in range(teams)
            ],
        ),
        capacity={"default": 16},
    )


def test_heads_set_aside_as_borrowers_leave_the_budget_to_the_second_pass() -> None:
    # Six teams, each at its guarantee of 1 GPU with a job waiting that would borrow; a budget of 4 heads.
    records = []
    for i in range(6):
        records.append(make_job(f"r{i}").team(f"t{i}").running_on((f"n{i % 4}", i // 4)).started_at(0.0).build())
        records.append(make_job(f"w{i}").team(f"t{i}").gpus(1).priority("research").at(NOW - 100 + i).build())
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(NODES, owners, {}, records, quota=book(6),
                                          config=SchedulerConfig(max_tests_per_cycle=4))  # fmt: skip
    placed = [d.job_id for d in state.cycle(NOW) if isinstance(d, Place)]
    assert placed == ["w0", "w1", "w2", "w3"]  # the budget decides how many; the idle GPUs are lent
