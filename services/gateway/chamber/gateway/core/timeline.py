"""A job's timeline, told from the durable logs: what the user asked (the JOBS stream), where the scheduler placed
it (`decisions.placed` on the DECISIONS stream) and what became of it (the versions of its record the jobs KV
bucket keeps). Pure: events in, entries out, oldest first.

Intent comes from JOBS (submitted, cancel requested); everything else from the record's changes, which are what
actually happened after the state machine (an executor report about a stale attempt never shows). A record read
after its history may be newer than it: the stored record, when newer, ends the story.
"""

import re
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from chamber.common.contracts import (
    GpuRef,
    JobCancelRequested,
    JobPlaced,
    JobRecord,
    JobState,
    JobStateChanged,
    JobSubmitted,
)

EntryKind = Literal[
    "submitted",
    "placed",
    "started",
    "resumed",
    "preempting",
    "interrupting",
    "preempted",
    "nominated",
    "cancel-requested",
    "succeeded",
    "failed",
    "cancelled",
]

_PREEMPTOR = re.compile(r"preempted by (\S+?)[\s;,)]")


class TimelineEntry(msgspec.Struct, kw_only=True):
    at: float
    kind: EntryKind
    detail: str = ""
    attempt: int | None = None
    gpus: list[GpuRef] | None = None
    by: str | None = None
    """The job that preempted this one, when the scheduler's reason names it."""


def _preemptor(reason: str) -> str | None:
    found = _PREEMPTOR.search(reason + " ")
    return found.group(1) if found else None


def _from_state_change(
    event: JobStateChanged, previous_stopping: bool, previous_nominated: bool, previous_started: float | None
) -> list[TimelineEntry]:
    """What one change of the record tells. A job that started and ended within one batch of the scheduler's
    events has no running version: its end's start time (`started_at`), new since the version before, tells its
    start."""
    r = event.record
    out: list[TimelineEntry] = []
    if r.stopping and not previous_stopping and r.state == JobState.RUNNING:
        kind: EntryKind = "interrupting" if r.stop_kind == "interrupt" else "preempting"
        by = _preemptor(r.stop_reason) if kind == "preempting" else None
        out.append(TimelineEntry(at=event.at, kind=kind, detail=r.stop_reason, attempt=r.attempt, by=by))
    if r.nominated and not previous_nominated:
        out.append(TimelineEntry(at=event.at, kind="nominated", detail=r.reason, gpus=list(r.nominated)))
    if event.previous == r.state.value:
        return out
    started: EntryKind = "resumed" if r.preemptions or r.interruptions or r.attempt > 1 else "started"
    if r.state == JobState.RUNNING:
        out.append(TimelineEntry(at=r.started_at or event.at, kind=started, detail=r.reason, attempt=r.attempt))
    elif r.state == JobState.PREEMPTED:
        out.append(TimelineEntry(at=event.at, kind="preempted", detail=r.reason, attempt=r.attempt,
                                 by=_preemptor(r.reason)))  # fmt: skip
    elif r.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        if r.started_at is not None and r.started_at != previous_started:
            out.append(TimelineEntry(at=r.started_at, kind=started, detail="running", attempt=r.attempt))
        kind = r.state.value  # type: ignore[assignment]  # the three terminal states are entry kinds
        out.append(TimelineEntry(at=r.finished_at or event.at, kind=kind, detail=r.reason, attempt=r.attempt))
    return out


def record_changes(versions: Sequence[JobRecord]) -> list[JobStateChanged]:
    """A record's stored versions, oldest first, as the changes they made: each with the state before it (none
    before the first one kept)."""
    changes: list[JobStateChanged] = []
    previous = ""
    for record in versions:
        changes.append(JobStateChanged(record=record, previous=previous, at=record.updated_at))
        previous = record.state.value
    return changes


def timeline(
    job_events: Iterable[JobSubmitted | JobCancelRequested],
    decisions: Iterable[JobPlaced | JobStateChanged],
    stored: JobRecord | None = None,
) -> list[TimelineEntry]:
    """The job's story, oldest first. Duplicate deliveries (same attempt placed twice) are told once. `stored`
    (the job's record as the KV holds it) tells what the log has not yet: its placement and its latest state."""
    entries: list[TimelineEntry] = []
    for e in job_events:
        if isinstance(e, JobSubmitted):
            s = e.spec
            entries.append(TimelineEntry(at=e.submitted_at, kind="submitted",
                                         detail=f"team {s.team}, {s.replicas} x {s.gpus_per_replica} GPUs, "
                                                f"priority {s.priority}"))  # fmt: skip
        else:
            entries.append(TimelineEntry(at=e.requested_at, kind="cancel-requested"))
    placed: set[int] = set()
    changes: list[JobStateChanged] = []
    for d in decisions:
        if isinstance(d, JobPlaced):
            if d.attempt not in placed:
                placed.add(d.attempt)
                entries.append(TimelineEntry(at=d.decided_at, kind="placed", detail=d.reason, attempt=d.attempt,
                                             gpus=list(d.gpus)))  # fmt: skip
        else:
            changes.append(d)
    if stored is not None:
        if stored.placement is not None and stored.placement.attempt not in placed:
            p = stored.placement
            placed.add(p.attempt)
            at = min(stored.updated_at, stored.started_at or stored.updated_at, stored.finished_at or stored.updated_at)
            entries.append(TimelineEntry(at=at, kind="placed", detail=p.reason, attempt=p.attempt, gpus=list(p.gpus)))
        logged = max(changes, key=lambda c: c.record.version, default=None)
        if logged is None or stored.version > logged.record.version:
            previous = JobState.PENDING.value if logged is None else logged.record.state.value
            if logged is not None and logged.record.attempt != stored.attempt:
                previous = ""  # a later attempt: the log's state says nothing about this one
            changes.append(JobStateChanged(record=stored, previous=previous, at=stored.updated_at))
    stopping = nominated = False
    started_at: float | None = None
    seen_versions: set[int] = set()
    for change in sorted(changes, key=lambda c: c.record.version):
        if change.record.version in seen_versions:
            continue
        seen_versions.add(change.record.version)
        entries.extend(_from_state_change(change, stopping, nominated, started_at))
        stopping, nominated = change.record.stopping, bool(change.record.nominated)
        started_at = change.record.started_at
    order = {"submitted": 0}
    return sorted(entries, key=lambda x: (x.at, order.get(x.kind, 1)))
