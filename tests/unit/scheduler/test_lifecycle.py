"""The job state machine, as a scenario table: (record before, event) -> state after, ledger effect."""

from dataclasses import dataclass

import pytest

from chamber.common.contracts import (
    GpuRef,
    JobCancelRequested,
    JobEvent,
    JobFinished,
    JobLaunchFailed,
    JobRecord,
    JobStarted,
    JobState,
    JobStopped,
    JobSubmitted,
    Placement,
)
from chamber.scheduler.core.lifecycle import apply_event, holds_gpus, needs_placement, place
from tests.support.builders import make_job

NOW = 100.0
pending = make_job("j1").build()
placed = place(pending, Placement(attempt=1, gpus=[GpuRef("n1", 0)]), NOW)
running = make_job("j1").running_on(("n1", 0)).build()


@dataclass(frozen=True)
class Case:
    name: str
    before: JobRecord | None
    event: JobEvent
    state: JobState | None
    """None: the event changes nothing."""
    release: int | None = None
    stop: int | None = None


CASES = [
    Case(
        "a submission creates a pending job",
        None,
        JobSubmitted(job_id="j1", spec=pending.spec, submitted_at=1.0),
        JobState.PENDING,
    ),
    Case(
        "a duplicate submission changes nothing",
        pending,
        JobSubmitted(job_id="j1", spec=pending.spec, submitted_at=1.0),
        None,
    ),
    Case(
        "the executor's start report makes a placed job running",
        placed,
        JobStarted(job_id="j1", attempt=1, started_at=NOW),
        JobState.RUNNING,
    ),
    Case(
        "a start report for another attempt is stale", placed, JobStarted(job_id="j1", attempt=2, started_at=NOW), None
    ),
    Case(
        "a start report for an unplaced job is ignored",
        pending,
        JobStarted(job_id="j1", attempt=0, started_at=NOW),
        None,
    ),
    Case(
        "a finished attempt succeeds and releases its GPUs",
        running,
        JobFinished(job_id="j1", attempt=1, finished_at=NOW),
        JobState.SUCCEEDED,
        release=1,
    ),
    Case(
        "a failed attempt fails and releases its GPUs",
        running,
        JobFinished(job_id="j1", attempt=1, finished_at=NOW, succeeded=False, message="oom"),
        JobState.FAILED,
        release=1,
    ),
    Case(
        "cancelling a pending job ends it at once",
        pending,
        JobCancelRequested(job_id="j1", requested_at=NOW),
        JobState.CANCELLED,
    ),
    Case(
        "cancelling a running job asks the executor to stop it",
        running,
        JobCancelRequested(job_id="j1", requested_at=NOW),
        JobState.RUNNING,
        stop=1,
    ),
    Case(
        "a stop without a cancel is a preemption: back to the queue",
        running,
        JobStopped(job_id="j1", attempt=1, stopped_at=NOW),
        JobState.PREEMPTED,
        release=1,
    ),
    Case("events about unknown jobs are ignored", None, JobStarted(job_id="j1", attempt=1, started_at=NOW), None),
    Case(
        "a failed launch releases the GPUs of a placed job, which waits again",
        placed,
        JobLaunchFailed(job_id="j1", attempt=1, failed_at=NOW, reason="image pull"),
        JobState.PENDING,
        release=1,
    ),
    Case(
        "a launch failure reported after the attempt started is too late: it runs on, holding its GPUs",
        running,
        JobLaunchFailed(job_id="j1", attempt=1, failed_at=NOW, reason="not running within 300 s"),
        None,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_transition(case: Case) -> None:
    transition = apply_event(case.before, case.event, NOW)
    if case.state is None:
        assert transition is None
        return
    assert transition is not None
    assert transition.record.state == case.state
    assert transition.release_attempt == case.release
    assert transition.stop_attempt == case.stop
    if case.before is not None:
        assert transition.record.version == case.before.version + 1


def test_cancelled_running_job_ends_cancelled_when_the_executor_stops_it() -> None:
    t1 = apply_event(running, JobCancelRequested(job_id="j1", requested_at=NOW), NOW)
    assert t1 is not None
    t2 = apply_event(t1.record, JobStopped(job_id="j1", attempt=1, stopped_at=NOW + 1), NOW + 1)
    assert t2 is not None
    assert t2.record.state == JobState.CANCELLED
    assert t2.release_attempt == 1
    assert not holds_gpus(t2.record)


def test_every_event_is_idempotent() -> None:
    """Applying an event twice (a redelivery after a crash) changes the record only once."""
    events: list[JobEvent] = [
        JobStarted(job_id="j1", attempt=1, started_at=NOW),
        JobFinished(job_id="j1", attempt=1, finished_at=NOW + 5),
    ]
    record = placed
    for event in events:
        t = apply_event(record, event, NOW)
        assert t is not None
        record = t.record
        assert apply_event(record, event, NOW) is None
    assert record.state == JobState.SUCCEEDED
    assert record.run_s == 5


def test_preempted_job_keeps_its_submit_time_and_accumulated_run_time() -> None:
    t = apply_event(running, JobStopped(job_id="j1", attempt=1, stopped_at=running.submitted_at + 7), NOW)
    assert t is not None
    assert t.record.submitted_at == running.submitted_at
    assert t.record.run_s == 7
    assert t.record.preemptions == 1
    assert t.record.stopped_at == running.submitted_at + 7, "where its run time ends, for budgets and decay"
    assert needs_placement(t.record)


@pytest.mark.parametrize(
    ("interrupt", "granted", "left"),
    [
        (False, 30.0, 20.0),  # a preemption: the job's grace, 10 s of it gone
        (True, 30.0, 20.0),  # a degraded GPU's drain: the same (it used to get none after a restart)
        (True, 0.0, 0.0),  # a fatal GPU: none
        (False, None, 20.0),  # a record from before the grant was kept: a preemption had the job's grace
        (True, None, 0.0),  # ... and an interruption none
    ],
)
def test_an_executor_restarted_during_a_stop_gives_what_is_left_of_the_grace_it_granted(
    interrupt: bool, granted: float | None, left: float
) -> None:
    from chamber.scheduler.core.lifecycle import grace_left, stop_requested

    record = make_job("j").grace_s(30.0).running_on(("n1", 0)).build()
    stopping = stop_requested(record, 100.0, "drained", interrupt, grace_s=granted)
    assert stopping.stop_grace_s == granted
    assert grace_left(stopping, 110.0) == left
