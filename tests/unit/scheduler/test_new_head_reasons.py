"""A job that becomes the head of its sub-queue in a cycle (the head before it started) gets a reason of its own
in that cycle, also when the walk stops before its turn because nothing is free and nobody may be preempted for
it (`_Cycle._exhausted`). Before, it kept the reason it got when it arrived, "queued behind earlier jobs of the
same priority, team and shape", while first in its sub-queue, as most heads of a full fleet did."""

from chamber.scheduler.core.decisions import Place, Wait
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulingState
from tests.support.builders import make_job, make_node

NOW = 10_000.0


def full_after_one_start() -> SchedulingState:
    """n0 (4 GPUs) runs y's inference job (not preemptible) on two GPUs. x waits with two 2-GPU jobs (J1, then
    J2, one sub-queue), z with a 1-GPU job (K) submitted between them: J1 takes the two free GPUs, and K's turn,
    before J2's, finds the fleet full with nothing to preempt."""
    running = make_job("R").team("y").priority("inference").running_on(("n0", 0), ("n0", 1)).started_at(0.0).build()
    queued = [
        make_job("J1").team("x").priority("research").gpus(2).at(NOW - 30).build(),
        make_job("K").team("z").priority("research").gpus(1).at(NOW - 20).build(),
        make_job("J2").team("x").priority("research").gpus(2).at(NOW - 10).build(),
    ]
    owners = {g.slot: running.id for g in running.placement.gpus} if running.placement else {}
    return SchedulingState.from_snapshot([make_node("n0").gpus(4).build()], owners, {}, [running, *queued])


def test_a_new_head_the_walk_does_not_reach_is_told_it_waits_for_capacity() -> None:
    decisions = full_after_one_start().cycle(NOW)
    assert [d.job_id for d in decisions if isinstance(d, Place)] == ["J1"]
    waits = {d.job_id: d.why for d in decisions if isinstance(d, Wait)}
    assert waits.keys() == {"K", "J2"}
    assert waits["K"].kind == waits["J2"].kind == WaitKind.CAPACITY
    assert waits["J2"].text == "waiting for 2 GPUs"


def test_a_head_told_at_an_earlier_turn_is_not_told_again() -> None:
    """The next cycle, nothing has changed: K is told again at its turn (the walk stops there), J2 is not: its
    reason from the cycle before holds."""
    state = full_after_one_start()
    state.cycle(NOW)
    decisions = state.cycle(NOW + 60)
    assert [(d.job_id, d.why.kind) for d in decisions if isinstance(d, Wait)] == [("K", WaitKind.CAPACITY)]
