"""A GPU that fails while its job checkpoints during a preemption's grace cuts the grace: the job is stopped at
once, as any job on a GPU with a fatal fault is (the checkpoint it would write needs the GPU; meanwhile the job
holds its GPUs and waits to start again elsewhere). The decision (`tests/unit/scheduler/test_scenarios.py`), the
record it writes here, and the executors' second, shorter stop (`tests/integration/test_sim_executor.py`; the
process executor's gang and the Kubernetes executor already take one)."""

import msgspec

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.controller import Controller
from chamber.scheduler.core.decisions import Preempt
from chamber.scheduler.core.lifecycle import grace_left, stop_requested
from tests.support.builders import fatal, make_job, make_node

SLOTS = [("n1", i) for i in range(4)]
NOW = 1_000.0


def _stopping(grace_s: float, at: float) -> Controller:
    control = Controller()
    running = make_job("t").grace_s(grace_s).running_on(*SLOTS).build()
    record = stop_requested(running, at, "preempted for hi", False, grace_s=grace_s)
    control.load([make_node("n1").gpus(4).build()], [record], {f"n1/{i}": "t/1" for i in range(4)}, {})
    return control


def test_a_cut_rewrites_the_stop_as_one_at_once_and_is_taken_once() -> None:
    control = _stopping(600.0, NOW)
    cut = Preempt("t", 1, 0.0, "interrupted at once: GPU n1/2 failed during its checkpoint grace", interrupt=True)
    changed = control.commit(cut, NOW + 10)
    assert changed is not None
    assert (changed.stop_kind, changed.stop_grace_s, grace_left(changed, NOW + 10)) == ("interrupt", 0.0, 0.0)
    assert control.commit(cut, NOW + 11) is None, "nothing left to cut"


def test_a_cut_keeps_the_move_the_job_was_stopping_for() -> None:
    control = _stopping(600.0, NOW)
    held = [GpuRef(node="n2", index=0)]
    control.records["t"] = msgspec.structs.replace(control.records["t"], move_to=held)
    changed = control.commit(Preempt("t", 1, 0.0, "cut", interrupt=True), NOW + 1)
    assert changed is not None
    assert changed.move_to == held


def test_only_a_stop_at_once_with_grace_left_cuts_a_stop() -> None:
    control = _stopping(600.0, NOW)
    assert control.commit(Preempt("t", 1, 30.0, "a second, graceful stop", interrupt=True), NOW + 1) is None
    assert control.commit(Preempt("t", 1, 0.0, "cut", interrupt=True), NOW + 700) is None, "its grace is over"
    assert control.commit(Preempt("t", 2, 0.0, "another attempt's", interrupt=True), NOW + 1) is None


def test_the_cycle_cuts_a_grace_the_store_says_is_running_and_not_one_it_says_was_cut() -> None:
    """After a restart the state is built from the records: a stop at once stays one."""
    for grace_s, cut in ((600.0, True), (0.0, False)):
        control = _stopping(grace_s, NOW)
        control.state.cordon("n1/2", fatal("XID 79"))
        decided = [d for d in control.cycle(NOW + 1) if isinstance(d, Preempt)]
        assert bool(decided) is cut, (grace_s, decided)
