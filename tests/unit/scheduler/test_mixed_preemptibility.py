"""A job may override its priority class's preemptibility, and preemptibility changes what a job may do: only
preemptible jobs borrow, and a `block-preemptible` budget stops only them. So jobs of one team, priority, standing
and shape that differ in it are in different sub-queues: a refused head says nothing about a job behind it that
may do what the head may not (found by review: the backfill look-ahead behind refused heads had been dropped on the
assumption that every job behind such a head is refused too)."""

import msgspec

from chamber.common.contracts import JobRecord
from chamber.scheduler.core.decisions import Place, Wait
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import make_job, make_node, pool_quota

NOW = 10_000.0


def preemptible(record: JobRecord, value: bool) -> JobRecord:
    return msgspec.structs.replace(record, spec=msgspec.structs.replace(record.spec, preemptible=value))


def test_a_non_preemptible_job_behind_a_budget_refused_preemptible_one_still_backfills() -> None:
    nodes = [make_node(f"n{i}").gpus(4).build() for i in range(2)]
    records = [
        # n0 busy for an hour; the 8-GPU gang reserves n0+n1 and holds n1's 4 free GPUs.
        make_job("r").team("c").priority("train").estimate(3600).running_on(*[("n0", i) for i in range(4)])
        .started_at(NOW - 60).build(),
        make_job("gang").team("b").gpus(4, replicas=2).priority("research").at(NOW - 300).build(),
        # Team a (budget: block-preemptible): same priority, team and shape.
        preemptible(make_job("a-head").team("a").gpus(1).priority("research").at(NOW - 200).build(), True),
        preemptible(make_job("a-short").team("a").gpus(1).priority("research").estimate(60).at(NOW - 100).build(),
                    False),
    ]  # fmt: skip
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(nodes, owners, {}, records, budget_blocks={"a": "block-preemptible"})
    assert state.queue.key_of(state.queue.jobs["a-head"]) != state.queue.key_of(state.queue.jobs["a-short"])
    decisions = state.cycle(NOW)
    waits = {d.job_id: d.why.kind for d in decisions if isinstance(d, Wait)}
    assert waits.get("gang") == WaitKind.RESERVED
    assert waits.get("a-head") == WaitKind.BUDGET
    # a-short is not refused by the budget (not preemptible) and ends in 60 s, before the gang's reserved start.
    assert "a-short" in [d.job_id for d in decisions if isinstance(d, Place)], waits


def test_a_preemptible_job_behind_a_quota_refused_non_preemptible_one_still_backfills() -> None:
    nodes = [make_node(f"n{i}").gpus(4).build() for i in range(4)]
    quota = pool_quota(16, ("a", "c", 4, None), ("b", "c", 12, None), ("c", "c", 0, None))
    records = [
        make_job("a-running").team("a").priority("research").running_on(*[("n0", i) for i in range(4)])
        .started_at(NOW - 60).build(),
        make_job("c-running").team("c").priority("train").estimate(3600).running_on(*[("n1", i) for i in range(4)])
        .started_at(NOW - 60).build(),
        make_job("gang").team("b").gpus(4, replicas=3).priority("research").at(NOW - 300).build(),
        # Team a is at its nominal: its non-preemptible job may not borrow; the preemptible one may.
        preemptible(make_job("a-head").team("a").gpus(1).priority("research").at(NOW - 200).build(), False),
        preemptible(make_job("a-short").team("a").gpus(1).priority("research").estimate(60).at(NOW - 100).build(),
                    True),
    ]  # fmt: skip
    owners = {g.slot: r.id for r in records if r.placement for g in r.placement.gpus}
    state = SchedulingState.from_snapshot(nodes, owners, {}, records, quota=quota)
    decisions = state.cycle(NOW)
    waits = {d.job_id: d.why for d in decisions if isinstance(d, Wait)}
    assert waits["gang"].kind == WaitKind.RESERVED
    assert waits["a-head"].kind == WaitKind.QUOTA, waits
    assert "a-short" in [d.job_id for d in decisions if isinstance(d, Place)], waits
