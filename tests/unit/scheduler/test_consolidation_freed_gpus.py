"""GPUs a reservation given up inside `consolidate` held are free again, but only the jobs on the consolidation list
get another turn there: a job on it that now fits as the fleet stands is left to the next cycle, where every
waiting job has its turn in queue order (found by review, when such a job was placed in `consolidate`)."""

from collections.abc import Sequence

from chamber.common.contracts import GpuRef
from chamber.scheduler.core.decisions import Nominate, Place, Wait
from chamber.scheduler.core.model import pending_from
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import make_job


def _fleet(config: SchedulerConfig) -> SchedulingState:
    """x0 (pool X): nx (train) runs 6 GPUs until t=1000, 2 free. y0 (pool Y): four 1-GPU research jobs, 4 free.
    y1 (pool Y): y (research) runs 4 GPUs, 4 free."""
    state = SchedulingState(config)
    for name, pool in (("x0", "X"), ("y0", "Y"), ("y1", "Y")):
        state.index.add_node(name, pool=pool, model="H100", rack="r", zone="z", capacity=8, free=range(8))
    running: list[tuple[str, str, str, Sequence[int], float | None]] = [
        ("nx", "train", "x0", range(6), 1000.0),
        ("y", "research", "y1", range(4), None),
        *((f"m{k}", "research", "y0", [k], None) for k in range(4)),
    ]
    for name, cls, node, indices, estimate in running:
        built = make_job(name).team("run").priority(cls).gpus(len(indices)).at(0.0)
        placed = pending_from((built.estimate(estimate) if estimate else built).build())
        state.place(placed, tuple(GpuRef(node, k) for k in indices), "running", 0.0, borrowing=False)
    return state


def test_a_lower_priority_job_does_not_take_what_a_reservation_given_up_freed_from_a_higher_one() -> None:
    """a (research, 8 GPUs, any pool) is blocked, reserved x0 (holding its 2 free GPUs), then given room on y0 by
    moving small jobs; its reservation is given up and x0's 2 GPUs are free. h (research, 1 GPU in X, after a) was
    blocked at its turn (x0's GPUs were held); lo (best-effort, 2 GPUs in X) was blocked too and is on the list.
    Placed in `consolidate`, lo took x0's 2 GPUs while h, ahead of it in the queue and of higher priority, could
    use them and waited (the property test's third invariant). lo waits; the next cycle decides in queue order."""
    state = _fleet(SchedulerConfig(order="fifo"))
    state.add(pending_from(make_job("a").team("t").priority("research").gpus(8).at(10.0).build()))
    state.add(pending_from(make_job("h").team("t").priority("research").gpus(1).pool("X").at(11.0).build()))
    state.add(pending_from(make_job("lo").team("t").priority("best-effort").gpus(2).pool("X").at(12.0).build()))
    decisions = state.cycle(200.0)
    assert [d.job_id for d in decisions if isinstance(d, Nominate)] == ["a"]
    placed = {d.job_id: d.gpus for d in decisions if isinstance(d, Place)}
    assert "h" in {d.job_id for d in decisions if isinstance(d, Wait)}
    h = state.queue.jobs["h"]
    for job_id, gpus in placed.items():
        bonus: dict[str, list[int]] = {}
        for g in gpus:
            bonus.setdefault(g.node, []).append(g.index)
        assert find_placement(state.index, h.shape, bonus=bonus) is None, f"{job_id} (lower) took capacity h could use"
