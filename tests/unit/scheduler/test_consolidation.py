"""Consolidation end to end through the controller: a move stops a job with its checkpoint grace, holds GPUs for
it elsewhere, and starts it again there as soon as it has stopped; the job it made room for starts with it."""

from chamber.common.contracts import JobFinished, JobStarted, JobStopped
from chamber.scheduler.core.consolidation import plan_consolidation, single_node_jobs
from chamber.scheduler.core.controller import Controller
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt
from chamber.scheduler.core.model import Shape
from tests.support.builders import degraded, make_job, make_node
from tests.unit.scheduler.test_scenarios import NOW, fragmented

NODES = [make_node("a").gpus(8).build(), make_node("b").gpus(8).build()]


def _controller() -> Controller:
    control = Controller()
    jobs = fragmented()
    owners = {g.slot: f"{r.id}/{r.attempt}" for r in jobs if r.placement for g in r.placement.gpus}
    control.load(NODES, jobs, owners, {})
    return control


def _commit(control: Controller, decisions: list[Decision], now: float) -> None:
    for d in decisions:
        control.commit(d, now)


def test_a_moved_job_starts_again_at_once_on_the_gpus_held_for_it() -> None:
    control = _controller()
    decisions = control.decide(NOW)
    moves = [d for d in decisions if isinstance(d, Preempt)]
    assert {d.job_id for d in moves} == {"s1", "s2"}
    assert all(d.move and d.by == "wide" for d in moves)
    (nominate,) = [d for d in decisions if isinstance(d, Nominate)]
    assert {g.node for g in nominate.gpus} == {"a"}
    assert set(nominate.victims) == {"s1/1", "s2/1"}  # as job/attempt
    held = {job: {g.slot for g in gpus} for job, gpus in control.state.moves.items()}
    assert set(held) == {"s1", "s2"}
    assert all(slot.startswith("b/") for slots in held.values() for slot in slots)
    _commit(control, decisions, NOW)
    # Nothing else may take the GPUs held for the movers meanwhile.
    control.state.invalidate()
    assert not [d for d in control.decide(NOW + 1) if isinstance(d, Place)]
    for i, job_id in enumerate(("s1", "s2")):
        control.apply(JobStopped(job_id=job_id, attempt=1, stopped_at=NOW + 30 + i, started_at=NOW - 600), NOW + 30)
    decisions = control.decide(NOW + 31)
    placed = {d.job_id: d for d in decisions if isinstance(d, Place)}
    assert set(placed) == {"s1", "s2", "wide"}
    for job_id in ("s1", "s2"):
        assert {g.slot for g in placed[job_id].gpus} == held[job_id]
        assert "moved to open room" in placed[job_id].reason
    assert {g.node for g in placed["wide"].gpus} == {"a"}
    slots = [g.slot for d in placed.values() for g in d.gpus]
    assert len(slots) == len(set(slots)), "no GPU is given twice"
    _commit(control, decisions, NOW + 31)
    record = control.records["s1"]
    assert record.preemptions == 1
    assert record.run_s == 630.0


def _restarted(control: Controller) -> Controller:
    """A new scheduler loaded from what the old one stored (records; the ledger's owners are the placements)."""
    records = list(control.records.values())
    owners = {g.slot: f"{r.id}/{r.attempt}" for r in records if r.placement for g in r.placement.gpus}
    restarted = Controller()
    restarted.load(NODES, records, owners, {})
    return restarted


def test_a_restarted_scheduler_still_holds_the_gpus_of_a_job_being_moved() -> None:
    """Restarted while the movers checkpoint (s1 still stopping, then s2 also stopped but not yet placed again):
    the GPUs held for them are held again from their records, and each starts on its own at once."""
    control = _controller()
    decisions = control.decide(NOW)
    held = {job: {g.slot for g in gpus} for job, gpus in control.state.moves.items()}
    _commit(control, decisions, NOW)
    assert {g.slot for g in control.records["s1"].move_to} == held["s1"]
    control = _restarted(control)
    assert {job: {g.slot for g in gpus} for job, gpus in control.state.moves.items()} == held
    control.replace(make_job("late").gpus(1).priority("research").at(NOW + 1).build())  # fits a held GPU
    decisions = control.decide(NOW + 1)
    assert not [d for d in decisions if isinstance(d, Place)], "nothing else takes the held GPUs"
    control.forget("late")
    control.apply(JobStopped(job_id="s2", attempt=1, stopped_at=NOW + 30, started_at=NOW - 600), NOW + 30)
    control = _restarted(control)  # s2 stopped, not yet placed again: its record still names its GPUs
    assert {g.slot for g in control.state.nominated["s2"].nominated} == held["s2"], "not back in the queue"
    control.apply(JobStopped(job_id="s1", attempt=1, stopped_at=NOW + 31, started_at=NOW - 600), NOW + 31)
    decisions = control.decide(NOW + 32)
    placed = {d.job_id: d for d in decisions if isinstance(d, Place)}
    assert set(placed) == {"s1", "s2", "wide"}
    for job_id in ("s1", "s2"):
        assert {g.slot for g in placed[job_id].gpus} == held[job_id]
    slots = [g.slot for d in placed.values() for g in d.gpus]
    assert len(slots) == len(set(slots)), "no GPU is given twice"
    _commit(control, decisions, NOW + 32)
    assert not control.records["s1"].move_to, "placed again: nothing is held for it any more"


def test_a_job_that_finishes_while_being_moved_gives_its_held_gpus_back() -> None:
    control = _controller()
    decisions = control.decide(NOW)
    _commit(control, decisions, NOW)
    free_before = control.state.index.free_total()
    control.apply(JobFinished(job_id="s1", attempt=1, finished_at=NOW + 5, started_at=NOW - 600), NOW + 5)
    assert "s1" not in control.state.moves
    assert control.state.index.free_total() == free_before + 1  # its held GPU on b (its own on a is wide's)


def test_a_plan_leaves_the_fleet_index_as_it_was() -> None:
    control = _controller()
    state = control.state
    before = {name: list(node.free) for name, node in state.index.nodes.items()}
    plan = plan_consolidation(
        state.index, Shape(4, 1), single_node_jobs(state.running.values()), NOW, movable=lambda r: True,
        max_moved_gpus=8,
    )  # fmt: skip
    assert plan is not None
    assert {m.job.id for m in plan.moves} == {"s1", "s2"}
    assert {name: list(node.free) for name, node in state.index.nodes.items()} == before
    assert plan_consolidation(
        state.index, Shape(4, 1), single_node_jobs(state.running.values()), NOW, movable=lambda r: True,
        max_moved_gpus=1,
    ) is None  # fmt: skip


def test_started_events_of_moved_jobs_are_ordinary() -> None:
    control = _controller()
    decisions = control.decide(NOW)
    _commit(control, decisions, NOW)
    for job_id in ("s1", "s2"):
        control.apply(JobStopped(job_id=job_id, attempt=1, stopped_at=NOW + 30, started_at=NOW - 600), NOW + 30)
    decisions = control.decide(NOW + 30)
    _commit(control, decisions, NOW + 30)
    for d in decisions:
        if isinstance(d, Place):
            control.apply(JobStarted(job_id=d.job_id, attempt=d.attempt, started_at=NOW + 30), NOW + 30)
    assert set(control.state.running) >= {"s1", "s2", "wide"}
    assert not control.state.moves
    assert not control.state.nominated
    assert not control.state.relocated
    assert not control.state.nominated_slots


def test_a_job_whose_held_gpus_were_dropped_is_told_even_when_the_walk_does_not_reach_it() -> None:
    """s1's held GPU is cordoned before it stops: it competes in the queue again, behind a job that never fits
    (the walk stops there, so s1 gets no decision of its own). Its record must stop naming the GPU: once the
    cordon is lifted, a restarted scheduler decides as the running one does (the GPU goes to the job ahead)."""
    never_fits = make_job("x").gpus(8, 3).priority("research").preempted(2).at(-5).build()
    records = [*fragmented(), never_fits]
    owners = {g.slot: f"{r.id}/{r.attempt}" for r in records if r.placement for g in r.placement.gpus}
    control = Controller()
    control.load(NODES, records, owners, {})
    _commit(control, control.decide(NOW), NOW)
    slot = control.state.moves["s1"][0].slot
    control.state.cordon(slot, degraded("test"))
    for job_id in ("s1", "s2"):
        control.apply(JobStopped(job_id=job_id, attempt=1, stopped_at=NOW + 30, started_at=NOW - 600), NOW + 30)
    _commit(control, control.decide(NOW + 31), NOW + 31)
    assert "s1" in control.state.queue.jobs
    assert not control.records["s1"].move_to
    control.replace(make_job("y").gpus(1).priority("research").preempted(2).at(NOW + 35).build())
    _commit(control, control.decide(NOW + 36), NOW + 36)
    control.state.uncordon(slot)
    restarted = _restarted(control)
    live = {d.job_id: d.gpus for d in control.decide(NOW + 40) if isinstance(d, Place)}
    again = {d.job_id: d.gpus for d in restarted.decide(NOW + 40) if isinstance(d, Place)}
    assert live == again
    assert set(again) == {"y"}
    assert {g.slot for g in again["y"]} == {slot}
