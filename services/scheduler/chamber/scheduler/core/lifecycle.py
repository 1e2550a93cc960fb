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
    JobRecord,
    JobStarted,
    JobState,
    JobStopped,
    JobSubmitted,
    Placement,
)


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
        started = _bump(record, now, state=JobState.RUNNING, started_at=event.started_at, reason="running")
        return Transition(started, record.state)
    if isinstance(event, JobFinished):
        ran = _run_time(record, event.finished_at)
        state = JobState.SUCCEEDED if event.succeeded else JobState.FAILED
        reason = "completed" if event.succeeded else f"failed: {event.message}"
        done = _bump(record, now, state=state, finished_at=event.finished_at, run_s=ran, reason=reason)
        return Transition(done, record.state, release_attempt=record.attempt)
    return _stopped(record, event, now)


def _stopped(record: JobRecord, event: JobStopped, now: float) -> Transition:
    ran = max(0.0, event.stopped_at - record.started_at) if record.started_at is not None else 0.0
    if record.cancel_requested:
        stopped = _bump(
            record, now, state=JobState.CANCELLED, finished_at=event.stopped_at, run_s=record.run_s + ran,
            reason="cancelled",
        )  # fmt: skip
        return Transition(stopped, record.state, release_attempt=record.attempt)
    saved = checkpointed(record, ran, event.graceful)
    interrupted = record.stop_kind == "interrupt"
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
            record, now, state=JobState.PREEMPTED, placement=None, started_at=None,
            reason=f"{reason}; requeued, resumes from its checkpoint", **common,
        )  # fmt: skip
    return Transition(stopped, record.state, release_attempt=record.attempt)


def checkpointed(record: JobRecord, ran: float, graceful: bool) -> float:
    """How much of `ran` seconds survives a stop: up to the last periodic checkpoint, or all of it when the job
    checkpoints on request and was given its grace period."""
    interval = record.spec.checkpoint_interval_s
    if interval:
        return ran - ran % interval
    return ran if graceful else 0.0


def stop_requested(record: JobRecord, now: float, reason: str, interrupt: bool) -> JobRecord:
    """The record after the scheduler asked the executor to stop it for a preemption or an interruption."""
    return _bump(record, now, stopping=True, stop_reason=reason, stop_kind="interrupt" if interrupt else "preempt",
                 reason=reason)  # fmt: skip


def nominate(record: JobRecord, now: float, gpus: list[GpuRef], reason: str) -> JobRecord:
    return _bump(record, now, nominated=gpus, reason=reason)


def _cancel(record: JobRecord, now: float) -> Transition | None:
    if record.cancel_requested:
        return None
    if record.placement is None:
        cancelled = _bump(
            record, now, state=JobState.CANCELLED, finished_at=now, cancel_requested=True, reason="cancelled"
        )
        return Transition(cancelled, record.state)
    stopping = _bump(record, now, cancel_requested=True, reason="cancelling")
    return Transition(stopping, record.state, stop_attempt=record.attempt)


def _run_time(record: JobRecord, until: float) -> float:
    if record.started_at is None:
        return record.run_s
    return record.run_s + max(0.0, until - record.started_at)


def place(record: JobRecord, placement: Placement, now: float) -> JobRecord:
    """The record after the scheduler placed a new attempt (the claim is already in the ledger)."""
    return _bump(
        record, now, attempt=placement.attempt, placement=placement, reason=placement.reason, nominated=[],
        stopping=False, stop_reason="", stop_kind="",
    )  # fmt: skip


def unplace(record: JobRecord, now: float, reason: str) -> JobRecord:
    """The record after a placement could not be kept (its claim was refused): back in the queue."""
    return _bump(record, now, placement=None, started_at=None, reason=reason)


def note(record: JobRecord, now: float, reason: str) -> JobRecord:
    """The record with a new explanation of why it is where it is (e.g. why it still waits)."""
    return _bump(record, now, reason=reason)


def needs_placement(record: JobRecord) -> bool:
    return record.placement is None and record.state in (JobState.PENDING, JobState.PREEMPTED)


def holds_gpus(record: JobRecord) -> bool:
    return record.placement is not None and record.state not in TERMINAL_STATES
