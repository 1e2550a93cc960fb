"""The chaos checker on hand-made histories: it finds each kind of violation, with its evidence, and no false one.

The central case is the crash test's old mistake: an executor that restarts reports the finish it had
scheduled, which can lie before the moment the scheduler released the GPUs; a hold ends at the release.
"""

from typing import Any

import msgspec

from chamber.common.contracts import (
    GpuRef,
    JobFinished,
    JobPlaced,
    JobRecord,
    JobSpec,
    JobStarted,
    JobState,
    JobStateChanged,
    JobSubmitted,
    Placement,
)
from tests.chaos.checker import HISTORY_KEPT, Evidence, Fault, check

SPEC = JobSpec(name="j", team="t", gpus_per_replica=1, duration_s=5.0)
GPU = GpuRef(node="n1", index=0)


class History:
    """A job history as the services would record it: submits, placements, state changes, executor reports."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.decisions: list[Any] = []
        self.records: dict[str, JobRecord] = {}

    def submit(self, job: str, at: float) -> "History":
        self.events.append(JobSubmitted(job_id=job, spec=SPEC, submitted_at=at))
        return self._change(job, at, "", state=JobState.PENDING, submitted_at=at)

    def place(self, job: str, at: float, attempt: int = 1, gpu: GpuRef = GPU) -> "History":
        self._change(job, at, "pending", attempt=attempt, placement=Placement(attempt, [gpu]))
        self.decisions.append(JobPlaced(job_id=job, attempt=attempt, gpus=[gpu], reason="", decided_at=at))
        return self

    def start(self, job: str, at: float, attempt: int = 1) -> "History":
        self.events.append(JobStarted(job_id=job, attempt=attempt, started_at=at))
        return self._change(job, at, "pending", state=JobState.RUNNING, started_at=at)

    def finish(self, job: str, finished_at: float, applied_at: float, *, run_s: float = 5.0) -> "History":
        """The executor's report (its scheduled `finished_at`) and the release the scheduler applied later."""
        self.events.append(JobFinished(job_id=job, attempt=self.records[job].attempt, finished_at=finished_at))
        return self._change(job, applied_at, "running", state=JobState.SUCCEEDED, finished_at=finished_at, run_s=run_s)

    def _change(self, job: str, at: float, previous: str, **changes: Any) -> "History":
        old = self.records.get(job)
        if old is None:
            record = JobRecord(id=job, spec=SPEC, state=JobState.PENDING, submitted_at=at, updated_at=at)
        else:
            record = msgspec.structs.replace(old, version=old.version + 1, updated_at=at)
        record = msgspec.structs.replace(record, **changes)
        self.records[job] = record
        self.decisions.append(JobStateChanged(record=record, previous=previous, at=at))
        return self

    def evidence(self, **extra: Any) -> Evidence:
        accepted = {e.job_id for e in self.events if isinstance(e, JobSubmitted)}
        return Evidence(accepted=accepted, events=self.events, decisions=self.decisions, records=self.records, **extra)


def violations(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    inv = report["invariants"][name]
    return list(inv.get("examples", []))


def test_a_clean_history_keeps_every_invariant() -> None:
    h = History().submit("a", 0).place("a", 1).start("a", 1).finish("a", 6, 6)
    h.submit("b", 2).place("b", 6.5).start("b", 6.5).finish("b", 11.5, 11.5)
    report = check(h.evidence(gpus_allocated_at_end=0))
    assert report["ok"], report["invariants"]


def test_a_hold_ends_at_the_release_not_at_the_executors_scheduled_finish() -> None:
    """After a restart the executor reports a finish scheduled for t=6; the scheduler released at t=20. A job
    placed on that GPU at t=10 overlapped the first one's hold (the old check, by finish time, missed it)."""
    h = History().submit("a", 0).place("a", 1).start("a", 1).finish("a", finished_at=6, applied_at=20)
    h.submit("b", 2).place("b", 10).start("b", 10).finish("b", 15, 21)
    (found,) = violations(check(h.evidence()), "no_gpu_held_twice")
    assert found["gpu"] == "n1/0"
    assert (found["first"]["job"], found["first"]["until"]) == ("a", 20)
    assert (found["second"]["job"], found["second"]["from"]) == ("b", 10)
    assert found["overlap_s"] == 10


def test_a_placement_after_the_release_is_no_overlap_even_if_the_finish_was_reported_late() -> None:
    h = History().submit("a", 0).place("a", 1).start("a", 1).finish("a", finished_at=6, applied_at=20)
    h.submit("b", 2).place("b", 20).start("b", 20).finish("b", 25, 25)
    assert check(h.evidence())["invariants"]["no_gpu_held_twice"]["ok"]


def test_a_job_that_never_ends_is_lost_and_still_holds_its_gpu() -> None:
    h = History().submit("a", 0).place("a", 1)
    h.submit("b", 2).place("b", 30).start("b", 30).finish("b", 35, 35)
    report = check(h.evidence())
    (lost,) = violations(report, "no_job_lost")
    history = lost.pop("history")
    assert lost == {"job": "a", "problem": "never ended", "state": "pending", "reason": "", "attempt": 1,
                    "placed": True}  # fmt: skip
    what = [row.split(maxsplit=1)[1] for row in history]
    assert what[0] == "event JobSubmitted attempt=-", "the job's own events and decisions, in time order"
    assert "placed attempt=1" in what
    (twice,) = violations(report, "no_gpu_held_twice")
    assert twice["first"]["release"] == "never released"


def test_a_job_accepted_but_not_stored_is_lost() -> None:
    h = History()
    report = check(Evidence(accepted={"ghost"}, events=h.events, decisions=h.decisions, records=h.records))
    assert violations(report, "no_job_lost") == [{"job": "ghost", "problem": "accepted by the API, absent from "
                                                  "the JOBS stream"}]  # fmt: skip


def test_a_job_that_ends_twice_or_changes_after_its_end() -> None:
    h = History().submit("a", 0).place("a", 1).start("a", 1).finish("a", 6, 6)
    h._change("a", 7, "succeeded", state=JobState.RUNNING)
    h._change("a", 8, "running", state=JobState.SUCCEEDED)
    problems = {v["problem"] for v in violations(check(h.evidence()), "finished_exactly_once")}
    assert problems == {"ended more than once", "changed after it ended"}


def test_an_end_stored_without_a_terminal_version_in_its_history_is_reported() -> None:
    h = History().submit("a", 0).place("a", 1).start("a", 1)
    h.records["a"] = msgspec.structs.replace(h.records["a"], state=JobState.SUCCEEDED, run_s=5.0, version=9)
    (found,) = violations(check(h.evidence()), "finished_exactly_once")
    assert found["problem"] == "ended in the KV but no terminal version is in its history"


def test_a_success_without_a_start_loses_its_gpu_hours() -> None:
    h = History().submit("a", 0).place("a", 1)
    h.events.append(JobFinished(job_id="a", attempt=1, finished_at=6))
    h._change("a", 6, "pending", state=JobState.SUCCEEDED, finished_at=6, run_s=0.0)
    (found,) = violations(check(h.evidence()), "gpu_hours_accounted")
    assert found["problem"] == "succeeded with started_at null"
    assert found["executor_reports"] == [("JobFinished", 1)]
    assert found["state_changes"] == [(1, "", "pending", 0), (2, "pending", "pending", 1), (3, "pending",
                                      "succeeded", 1)]  # fmt: skip


def test_a_job_seen_late_after_a_fault_is_reported_with_the_fault() -> None:
    h = History()
    h.events.append(JobSubmitted(job_id="a", spec=SPEC, submitted_at=100.0))
    h._change("a", 131.0, "", state=JobState.PENDING, submitted_at=100.0)
    h.place("a", 131.5).start("a", 131.5).finish("a", 136.5, 136.5)
    report = check(h.evidence(faults=[Fault("kill", "scheduler", 99.7)], started_at=90.0))
    (late,) = violations(report, "jobs_seen_within_10s")
    assert late == {"job": "a", "seen_after_s": 31.0, "versions_kept": 4, "first_version_kept": 1,
                    "submitted_t": 10.0, "last_fault": "kill scheduler", "submit_minus_fault_s": 0.3}  # fmt: skip


def test_a_job_whose_first_versions_are_gone_is_not_judged_seen_late_but_named() -> None:
    """The bucket keeps a record's last 64 versions: a job with that many may have lost its first one, and when it
    was first seen is then not known."""
    h = History()
    h.events.append(JobSubmitted(job_id="a", spec=SPEC, submitted_at=100.0))
    for i in range(HISTORY_KEPT):
        h._change("a", 131.0 + i, "pending" if i else "", state=JobState.PENDING, submitted_at=100.0)
    report = check(h.evidence(started_at=90.0))
    assert violations(report, "jobs_seen_within_10s") == []
    assert report["history_truncated"] == ["a"]


def test_recovery_is_the_time_to_the_next_progress_with_work_pending() -> None:
    h = History().submit("a", 0).place("a", 1).start("a", 1).finish("a", 6, 6)
    h.submit("b", 7).place("b", 19).start("b", 19).finish("b", 24, 24)
    faults = [Fault("kill", "scheduler", 8.0), Fault("kill", "gateway", 30.0)]
    report = check(h.evidence(faults=faults))
    rows = report["recovery"]["per_fault"]
    assert rows == [{"fault": "kill scheduler", "t": 8.0, "recovery_s": 11.0},
                    {"fault": "kill gateway", "t": 30.0, "recovery_s": None}]  # fmt: skip
    assert violations(report, "recovery_within_10s") == [rows[0]]


def test_dead_letters_and_leaked_gpus_are_violations() -> None:
    h = History().submit("a", 0).place("a", 1).start("a", 1).finish("a", 6, 6)
    dead = [{"service": "scheduler", "subject": "ns.jobs.lifecycle.a", "reason": "handler failed 10 times"}]
    report = check(h.evidence(dead_letters=dead, gpus_allocated_at_end=8))
    assert violations(report, "no_dead_letters") == dead
    assert violations(report, "no_gpu_leaked") == [{"gpus_allocated": 8}]
