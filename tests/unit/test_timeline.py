"""A job's timeline from its logs, and from its stored record where the logs lag it (the scheduler writes the
record before it publishes the change, so a reader can see the job finished before the log does)."""

import msgspec
import pytest

from chamber.common.contracts import JobPlaced, JobRecord, JobState, JobStateChanged, JobSubmitted
from chamber.gateway.core.timeline import record_changes, timeline
from tests.support.builders import make_job

_RUNNING = make_job("j").running_on(("n1", 0), ("n1", 1)).at(10.0).started_at(12.0).build()


def _version(record: JobRecord, version: int, **changes: object) -> JobRecord:
    return msgspec.structs.replace(record, version=version, **changes)


_PENDING = _version(_RUNNING, 1, state=JobState.PENDING, placement=None, started_at=None, attempt=0)
_PLACED = _version(_RUNNING, 2, state=JobState.PENDING, started_at=None, updated_at=11.0)
_STARTED = _version(_RUNNING, 3, updated_at=12.0)
_DONE = _version(_RUNNING, 4, state=JobState.SUCCEEDED, finished_at=15.0, updated_at=15.0)
_SUBMITTED = JobSubmitted(job_id="j", spec=_RUNNING.spec, submitted_at=10.0)
assert _RUNNING.placement is not None
_PLACE = JobPlaced(job_id="j", attempt=1, gpus=_RUNNING.placement.gpus, reason="fits", decided_at=11.0)


def _changed(record: JobRecord, previous: JobRecord) -> JobStateChanged:
    return JobStateChanged(record=record, previous=previous.state.value, at=record.updated_at)


_LOG = [_changed(_PLACED, _PENDING), _PLACE, _changed(_STARTED, _PLACED), _changed(_DONE, _STARTED)]
_RESUMED = _version(_RUNNING, 7, attempt=2, preemptions=1, started_at=20.0, updated_at=20.0,
                    placement=msgspec.structs.replace(_RUNNING.placement, attempt=2))  # fmt: skip
_NEVER_STARTED = _version(_PLACED, 5, state=JobState.FAILED, finished_at=13.5, updated_at=13.9)


@pytest.mark.parametrize(
    ("decisions", "stored", "kinds"),
    [
        pytest.param(_LOG, None, ["submitted", "placed", "started", "succeeded"], id="the log alone"),
        pytest.param(_LOG, _DONE, ["submitted", "placed", "started", "succeeded"], id="log and store agree"),
        pytest.param(_LOG[:3], _DONE, ["submitted", "placed", "started", "succeeded"], id="the end not logged yet"),
        pytest.param(_LOG[:1], _STARTED, ["submitted", "placed", "started"], id="placement and start not logged"),
        pytest.param([], _STARTED, ["submitted", "placed", "started"], id="nothing logged yet"),
        pytest.param([], _PENDING, ["submitted"], id="still pending"),
        pytest.param(_LOG, _STARTED, ["submitted", "placed", "started", "succeeded"], id="an older stored copy"),
        pytest.param(
            _LOG[:3],
            _RESUMED,
            ["submitted", "placed", "started", "placed", "resumed"],
            id="a later attempt not logged yet",
        ),
        pytest.param([], _NEVER_STARTED, ["submitted", "placed", "failed"], id="failed before it started"),
    ],
)
def test_the_timeline_tells_what_the_log_or_the_store_knows(
    decisions: list[JobPlaced | JobStateChanged], stored: JobRecord | None, kinds: list[str]
) -> None:
    entries = timeline([_SUBMITTED], decisions, stored)
    assert [e.kind for e in entries] == kinds
    assert [e.at for e in entries] == sorted(e.at for e in entries)
    placed = [e for e in entries if e.kind == "placed"]
    assert all(e.gpus == _RUNNING.placement.gpus for e in placed)  # type: ignore[union-attr]


def test_a_records_history_is_the_log_of_its_changes() -> None:
    """The versions the jobs bucket keeps, oldest first, each with the state before it; a version that only changed
    the waiting reason tells nothing new."""
    reason_only = _version(_PENDING, 2, reason="waiting: queued behind 3 jobs", updated_at=10.5)
    versions = [_PENDING, reason_only, *(_version(r, r.version + 1) for r in (_PLACED, _STARTED, _DONE))]
    changes = record_changes(versions)
    assert [(c.previous, c.record.version, c.at) for c in changes] == [
        ("", 1, _PENDING.updated_at), ("pending", 2, 10.5), ("pending", 3, 11.0), ("pending", 4, 12.0),
        ("running", 5, 15.0),
    ]  # fmt: skip
    kinds = [e.kind for e in timeline([_SUBMITTED], [_PLACE, *changes], versions[-1])]
    assert kinds == ["submitted", "placed", "started", "succeeded"]
    assert record_changes([]) == []


def test_a_job_that_started_and_ended_in_one_batch_tells_its_start() -> None:
    """The scheduler applied its start and its end together: the history holds no running version, and the end's
    start time tells the start (before, the timeline went from placed to succeeded). A job stopped and requeued
    before it ended tells its new start as a resume; one that never started tells none."""
    history = record_changes([_PENDING, _PLACED, _version(_DONE, 3)])
    entries = timeline([_SUBMITTED], [_PLACE, *history], None)
    assert [(e.kind, e.at) for e in entries] == [("submitted", 10.0), ("placed", 11.0), ("started", 12.0),
                                                ("succeeded", 15.0)]  # fmt: skip
    requeued = _version(_PLACED, 5, placement=None, preemptions=1, updated_at=16.0)
    again = _version(_DONE, 6, attempt=2, preemptions=1, started_at=18.0, finished_at=19.0, updated_at=19.0)
    later = record_changes([_PENDING, _PLACED, _STARTED, requeued, again])
    assert [e.kind for e in timeline([_SUBMITTED], [_PLACE, *later], None)] == [
        "submitted", "placed", "started", "resumed", "succeeded"]  # fmt: skip
    assert [e.kind for e in timeline([_SUBMITTED], record_changes([_PENDING, _PLACED, _NEVER_STARTED]), None)] == [
        "submitted", "failed"]  # fmt: skip
