"""A job backfilled into a reservation's held GPUs is admitted by its team's quota like any other. Backfill
looks behind a blocked sub-queue head, and the head may be blocked by the quota itself: the jobs behind it ask
for the same, so placing them there took the team past its quota (seen in the load-0.8 replay: 7 jobs placed
although their cohort had nothing to lend)."""

from chamber.scheduler.core.decisions import Place, Wait
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import make_job, make_node, pool_quota

NOW = 10_000.0
NODES = [make_node(f"n{i}").gpus(4).build() for i in range(4)]  # 16 GPUs in pool "default"


def test_a_job_behind_a_head_its_quota_refuses_is_not_backfilled_past_the_quota() -> None:
    quota = pool_quota(16, ("a", "c", 4, 0), ("b", "c", 12, None), ("c", "c", 0, None))
    records = [
        # Team a holds its whole quota (and may not borrow); team c's non-preemptible job holds n1 for an hour.
        make_job("a-running").team("a").priority("research").running_on(*[("n0", i) for i in range(4)])
        .started_at(NOW - 60).build(),
        make_job("c-running").team("c").priority("train").estimate(3600).running_on(*[("n1", i) for i in range(4)])
        .started_at(NOW - 60).build(),
        # Team b's 12-GPU gang does not fit the 8 free GPUs: it reserves n1, n2, n3 and holds n2 and n3.
        make_job("gang").team("b").gpus(4, replicas=3).priority("research").at(NOW - 300).build(),
        # Team a's next jobs: its quota refuses the head; the short one behind it would fit the held GPUs.
        make_job("a-head").team("a").gpus(1).priority("research").at(NOW - 200).build(),
        make_job("a-short").team("a").gpus(1).priority("research").estimate(60).at(NOW - 100).build(),
    ]  # fmt: skip
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(NODES, owners, {}, records, quota=quota)
    decisions = state.cycle(NOW)
    waits = {d.job_id: d.why.kind for d in decisions if isinstance(d, Wait)}
    assert waits.get("gang") == WaitKind.RESERVED
    assert waits.get("a-head") == WaitKind.QUOTA
    assert not [d.job_id for d in decisions if isinstance(d, Place)], "team a is at its quota and may not borrow"
    assert state.usage.get(("a", "default")) == 4
