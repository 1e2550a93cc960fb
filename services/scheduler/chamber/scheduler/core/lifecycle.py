"""The job state machine: how each event changes a job record, and what must happen in the ledger as a result.

Every transition is idempotent: replaying an event that was already applied (a redelivery after a crash)
yields no change. Events about an attempt other than the record's current one are stale and ignored.
"""

from dataclasses import dataclass

import msgspec

from chamber.common.contracts import (
    TERMINAL_STATES,
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
from chamber.scheduler.core.checkpoint import saved_work

MAX_LAUNCH_FAILURES = 3
"""A job whose launch failed this many times in a row fails: its spec cannot run on this executor."""


@dataclass(frozen=True, slots=True)
class Transition:
    record: JobRecord
    previous: JobState | None
    """None when the record was just created."""
    release_attempt: int | None = None
    """Release the ledger claim of this attempt (the attempt ended)."""
    stop_attempt: int | None = None
    """Ask the executor to stop this attempt (it was cancelled while placed or running)."""


def _bump(record: JobRecord, now: float, **changes: object) -> JobRecord:
    return msgspec.structs.replace(record, version=record.version + 1, updated_at=now, **changes)


def apply_event(record: JobRecord | None, event: JobEvent, now: float) -> Transition | None:
    """The transition an event causes, or None when it changes nothing (duplicate, stale or unknown job)."""
    if isinstance(event, JobSubmitted):
        if record is not None:
            return None
        created = JobRecord(
            id=event.job_id,
            spec=event.spec,
            state=JobState.PENDING,
            submitted_at=event.submitted_at,
            updated_at=now,
            reason="queued",
        )
        return Transition(created, None)
    if record is None or record.state in TERMINAL_STATES:
        return None
    if isinstance(event, JobCancelRequested):
        return _cancel(record, now)
    if event.attempt != record.attempt or record.placement is None:
        return None
    if isinstance(event, JobStarted):
        if record.state == JobState.RUNNING:
            return None
        running = _bump(
            record, now, state=JobState.RUNNING, started_at=event.started_at, reason="running", reason_kind="",
            launch_failures=0,
        )  # fmt: skip
        return Transition(running, record.state)
    if isinstance(event, JobFinished):
        started = _started(record, event.started_at, event.finished_at)
        ran = record.run_s + max(0.0, event.finished_at - started)
        state = JobState.SUCCEEDED if event.succeeded else JobState.FAILED
        reason = "completed" if event.succeeded else f"failed: {event.message}"
        done = _bump(
            record, now, state=state, started_at=started, finished_at=event.finished_at, run_s=ran, reason=reason,
            reason_kind="", stopping=False, launch_failures=0,
        )  # fmt: skip
        return Transition(done, record.state, release_attempt=record.attempt)
    if isinstance(event, JobLaunchFailed):
        if record.state == JobState.RUNNING:
            # The attempt started after all: the scheduler's launch deadline fired as its start was on the way.
            # Taking the failure would release GPUs the job runs on, and nothing would stop it.
            return None
        return _launch_failed(record, event, now)
    return _stopped(record, event, now)


def _started(record: JobRecord, reported: float | None, until: float) -> float:
    """When the attempt started: as the executor reports it with the attempt's end (it knows; after a restart it
    may have started the attempt again), else from the record, else (never reported) at `until`, so nothing is
    counted that nobody saw run."""
    if reported is not None:
        return reported
    return record.started_at if record.started_at is not None else until


def _launch_failed(record: JobRecord, event: JobLaunchFailed, now: float) -> Transition:
    failures = record.launch_failures + 1
    if record.cancel_requested or failures >= MAX_LAUNCH_FAILURES:
        state = JobState.CANCELLED if record.cancel_requested else JobState.FAILED
        reason = "cancelled" if record.cancel_requested else f"launch failed {failures} times: {event.reason}"
        done = _bump(
            record, now, state=state, finished_at=event.failed_at, reason=reason, reason_kind="", stopping=False,
            launch_failures=failures,
        )  # fmt: skip
        return Transition(done, record.state, release_attempt=record.attempt)
    back = _bump(
        record, now, placement=None, started_at=None, stopping=False, stop_reason="", stop_kind="",
        launch_failures=failures, reason=f"launch failed: {event.reason}; requeued", reason_kind="",
    )  # fmt: skip
    return Transition(back, record.state, release_attempt=record.attempt)


def _stopped(record: JobRecord, event: JobStopped, now: float) -> Transition:
    started = _started(record, event.started_at, event.stopped_at)
    ran = max(0.0, event.stopped_at - started)
    if record.cancel_requested:
        stopped = _bump(
            record, now, state=JobState.CANCELLED, finished_at=event.stopped_at, run_s=record.run_s + ran,
            reason="cancelled", reason_kind="", stopping=False,
        )  # fmt: skip
        return Transition(stopped, record.state, release_attempt=record.attempt)
    saved = checkpointed(record, ran, event.graceful)
    interrupted = record.stop_kind == "interrupt" or event.interrupted
    common = {
        "run_s": record.run_s + saved,
        "lost_s": record.lost_s + (ran - saved),
        "preemptions": record.preemptions + (not interrupted),
        "interruptions": record.interruptions + interrupted,
        "stopping": False,
    }
    reason = record.stop_reason or event.reason or "preempted"
    if record.spec.requeue == "never":
        stopped = _bump(
            record, now, state=JobState.FAILED, finished_at=event.stopped_at, reason=f"{reason}; not requeued", **common
        )
    else:
        stopped = _bump(
            record, now, state=JobState.PREEMPTED, placement=None, started_at=None, stopped_at=event.stopped_at,
            reason=f"{reason}; requeued, resumes from its checkpoint", **common,
        )  # fmt: skip
    return Transition(stopped, record.state, release_attempt=record.attempt)


def checkpointed(record: JobRecord, ran: float, graceful: bool) -> float:
    """How much of `ran` seconds of this job's current attempt survives a stop."""
    return saved_work(ran, record.spec.checkpoint_interval_s, graceful)


def stop_requested(
    record: JobRecord, now: float, reason: str, interrupt: bool, move_to: list[GpuRef] | None = None, *,
    grace_s: float | None = None,
) -> JobRecord:  # fmt: skip
    """The record after the scheduler asked the executor to stop it for a preemption or an interruption (or a
    move: `move_to` are the GPUs held for its next attempt), with `grace_s` to checkpoint."""
    return _bump(record, now, stopping=True, stop_reason=reason, stop_kind="interrupt" if interrupt else "preempt",
                 reason=reason, reason_kind="", move_to=move_to or [], stop_grace_s=grace_s)  # fmt: skip


def grace_left(record: JobRecord, now: float) -> float:
    """What is left at `now` of the checkpoint grace a stopping record's stop granted (for an executor that
    re-sends the stop after a restart): one rule for every executor."""
    granted = record.stop_grace_s
    if granted is None:  # a record from before the grant was kept
        granted = record.spec.checkpoint_grace_s if record.stop_kind == "preempt" else 0.0
    return max(0.0, record.updated_at + granted - now)


def nominate(record: JobRecord, now: float, gpus: list[GpuRef], reason: str, victims: list[str]) -> JobRecord:
    return _bump(record, now, nominated=gpus, waiting_for=victims, reason=reason, reason_kind="preempting")


def _cancel(record: JobRecord, now: float) -> Transition | None:
    if record.cancel_requested:
        return None
    if record.placement is None:
        cancelled = _bump(
            record,
            now,
            state=JobState.CANCELLED,
            finished_at=now,
            cancel_requested=True,
            reason="cancelled",
            reason_kind="",
            nominated=[],
            waiting_for=[],
        )
        return Transition(cancelled, record.state)
    stopping = _bump(record, now, cancel_requested=True, reason="cancelling")
    return Transition(stopping, record.state, stop_attempt=record.attempt)


def place(record: JobRecord, placement: Placement, now: float) -> JobRecord:
    """The record after the scheduler placed a new attempt (the claim is already in the ledger)."""
    return _bump(
        record, now, attempt=placement.attempt, placement=placement, reason=placement.reason, nominated=[],
        waiting_for=[], stopping=False, stop_reason="", stop_kind="", stop_grace_s=None, reason_kind="", move_to=[],
    )  # fmt: skip


def note(record: JobRecord, now: float, reason: str, kind: str) -> JobRecord:
    """The record with a new explanation of why it waits (stored when its kind or words change)."""
    return _bump(record, now, reason=reason, reason_kind=kind)


def unnominate(record: JobRecord, now: float) -> JobRecord:
    """The preemption plan (or the GPUs held for a moved job) no longer holds (a nominated GPU failed): the job
    competes again."""
    return _bump(record, now, nominated=[], waiting_for=[], move_to=[], reason="queued", reason_kind="queued")


def needs_placement(record: JobRecord) -> bool:
    return record.placement is None and record.state in (JobState.PENDING, JobState.PREEMPTED)


def holds_gpus(record: JobRecord) -> bool:
    return record.placement is not None and record.state not in TERMINAL_STATES
