"""An independent checker of a run's invariants, from what the system recorded (no access to its code).

Evidence: the JOBS stream (submits and the executor's reports), the DECISIONS stream (placements), every version of
every job's record (the jobs KV bucket keeps them: each is a state change, with the state before it) and the last
one, the dead letters, the GPUs still allocated at the end, the ids the API accepted and the faults with their
times.

Times come from the scheduler's clock (`JobPlaced.decided_at`, `JobStateChanged.at`, the records' `updated_at`),
all on one machine. An attempt holds its GPUs from its placement until its release: the first state change
after which the record no longer holds that attempt (terminal, requeued, or another attempt). Only a placement
the scheduler announced (`JobPlaced`, published once it proved its lead, before any launch) holds anything: a
leader deposed between its claim and its record write leaves a version placing the job on GPUs whose claim the new
leader released, and that placement, never announced or launched, is given back. An executor's
`finished_at` is *not* a release time: after a restart it reports the finish it had scheduled, which may lie
in the past.

Each invariant gives `ok`, a count and up to `MAX_EXAMPLES` violations with their evidence.
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chamber.common.contracts import (
    TERMINAL_STATES,
    JobEvent,
    JobFinished,
    JobPlaced,
    JobRecord,
    JobStarted,
    JobStateChanged,
    JobStopped,
    JobSubmitted,
)

MAX_EXAMPLES = 10
RECOVERY_BOUND_S = 10.0
"""After a fault, with work pending, the next placement or finish comes within this."""
SEEN_BOUND_S = 10.0
"""A submitted job gets its record (the scheduler saw it) within this, faults or not."""
RUN_TOLERANCE_S = 0.01
HISTORY_KEPT = 64
"""Versions of a record the jobs bucket keeps (`JOB_HISTORY`): a job with that many may have lost its first."""


@dataclass(frozen=True)
class Fault:
    kind: str
    """`kill`, `nats-restart`, `redis-flush` or `pause` (the leading scheduler frozen past its lease)."""
    target: str
    at: float
    """Epoch seconds when the fault began."""
    down_s: float = 0.0


@dataclass
class Evidence:
    accepted: set[str]
    """Job ids the API answered 201 for."""
    events: list[JobEvent]
    decisions: list[JobPlaced | JobStateChanged]
    records: dict[str, JobRecord]
    """The last stored record of each job."""
    faults: list[Fault] = field(default_factory=list)
    dead_letters: list[dict[str, str]] = field(default_factory=list)
    gpus_allocated_at_end: int | None = None
    started_at: float = 0.0
    """When the run began (epoch seconds): fault times are reported relative to it."""


@dataclass(frozen=True)
class Hold:
    job: str
    attempt: int
    start: float
    end: float
    how: str
    """Where `end` came from."""


class Invariant:
    def __init__(self, name: str, claim: str) -> None:
        self.name = name
        self.claim = claim
        self.count = 0
        self.examples: list[dict[str, Any]] = []

    def violated(self, **evidence: Any) -> None:
        self.count += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(evidence)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.count == 0, "claim": self.claim, "violations": self.count}
        if self.examples:
            out["examples"] = self.examples
        return out


def holds(record: JobRecord, attempt: int) -> bool:
    return record.placement is not None and record.placement.attempt == attempt and record.state not in TERMINAL_STATES


def _r(x: float) -> float:
    return round(x, 3)


class Checker:
    def __init__(self, ev: Evidence) -> None:
        self.ev = ev
        self.submitted: dict[str, JobSubmitted] = {}
        for e in ev.events:
            if isinstance(e, JobSubmitted):
                self.submitted.setdefault(e.job_id, e)
        self.changes: dict[str, list[JobStateChanged]] = defaultdict(list)
        self.placed: dict[tuple[str, int], JobPlaced] = {}
        for d in ev.decisions:
            if isinstance(d, JobStateChanged):
                self.changes[d.record.id].append(d)
            elif (d.job_id, d.attempt) not in self.placed:
                self.placed[(d.job_id, d.attempt)] = d
        for changes in self.changes.values():
            changes.sort(key=lambda c: c.record.version)
        self.jobs = set(self.submitted) | ev.accepted

    # ---- the invariants ------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        invariants = [
            self.no_job_lost(),
            self.finished_exactly_once(),
            self.no_gpu_held_twice(),
            self.gpu_hours_accounted(),
            self.jobs_seen_promptly(),
            self.no_dead_letters(),
            self.no_gpu_leaked(),
        ]
        recovery, recovery_inv = self.recovery()
        invariants.append(recovery_inv)
        report: dict[str, Any] = {
            "ok": all(inv.count == 0 for inv in invariants),
            "started_at_epoch": self.ev.started_at,
            "jobs": len(self.jobs),
            "accepted": len(self.ev.accepted),
            "final_states": _counts(r.state.value for r in self.ev.records.values()),
            "faults": _counts(f"{f.kind} {f.target}" if f.kind == "kill" else f.kind for f in self.ev.faults),
            "invariants": {inv.name: inv.report() for inv in invariants},
        }
        report["history_truncated"] = sorted(job for job, c in self.changes.items() if len(c) >= HISTORY_KEPT)[:10]
        report["recovery"] = recovery
        report["latency"] = self.latencies()
        return report

    def no_job_lost(self) -> Invariant:
        inv = Invariant("no_job_lost", "every accepted job was stored, and every stored job ended")
        for job in sorted(self.jobs):
            record = self.ev.records.get(job)
            if job not in self.submitted:
                inv.violated(job=job, problem="accepted by the API, absent from the JOBS stream")
            elif record is None:
                inv.violated(job=job, problem="submitted, but no record was ever stored")
            elif record.state not in TERMINAL_STATES:
                inv.violated(
                    job=job,
                    problem="never ended",
                    state=record.state.value,
                    reason=record.reason,
                    attempt=record.attempt,
                    placed=record.placement is not None,
                    history=self.history(job),
                )
        return inv

    def history(self, job: str) -> list[str]:
        """The job's events and decisions in time order, relative to the run's start: what a violation needs."""
        t0 = self.ev.started_at
        rows: list[tuple[float, str]] = []
        for e in self.ev.events:
            if e.job_id == job:
                at = next((getattr(e, f) for f in ("submitted_at", "finished_at", "stopped_at", "failed_at",
                                                    "started_at") if getattr(e, f, None)), 0.0)  # fmt: skip
                rows.append((at, f"event {type(e).__name__} attempt={getattr(e, 'attempt', '-')}"))
        for c in self.changes.get(job, []):
            rows.append((c.at, f"state v{c.record.version} {c.previous or '-'}->{c.record.state.value}"))
        for (placed_job, attempt), p in self.placed.items():
            if placed_job == job:
                rows.append((p.decided_at, f"placed attempt={attempt}"))
        return [f"{at - t0:8.3f} {what}" for at, what in sorted(rows)]

    def finished_exactly_once(self) -> Invariant:
        inv = Invariant(
            "finished_exactly_once",
            "each job has exactly one terminal transition in its record's history, matching its stored record, and "
            "no change after it",
        )
        for job in sorted(self.jobs):
            changes = self.changes.get(job, [])
            terminal = [c for c in changes if c.record.state in TERMINAL_STATES]
            versions = {c.record.version for c in terminal}
            firsts = [c for c in terminal if c.previous not in {s.value for s in TERMINAL_STATES}]
            record = self.ev.records.get(job)
            if not terminal:
                if record is not None and record.state in TERMINAL_STATES:
                    inv.violated(
                        job=job,
                        problem="ended in the KV but no terminal version is in its history",
                        state=record.state.value,
                        version=record.version,
                    )
                continue
            if len({c.record.state for c in terminal}) > 1 or len(firsts) > 1:
                inv.violated(
                    job=job,
                    problem="ended more than once",
                    transitions=[(c.record.version, c.previous, c.record.state.value) for c in terminal],
                )
            first = min(versions)
            after = [c for c in changes if c.record.version > first and c.record.state not in TERMINAL_STATES]
            if after:
                inv.violated(
                    job=job,
                    problem="changed after it ended",
                    ended_at_version=first,
                    then=[(c.record.version, c.record.state.value) for c in after],
                )
            if record is not None and record.state != terminal[0].record.state:
                inv.violated(
                    job=job,
                    problem="stored state differs from the terminal decision",
                    stored=record.state.value,
                    decided=terminal[0].record.state.value,
                )
        finished: dict[tuple[str, int], int] = defaultdict(int)
        for e in self.ev.events:
            if isinstance(e, JobFinished):
                finished[(e.job_id, e.attempt)] += 1
        for (job, attempt), n in finished.items():
            if n > 1:
                inv.violated(job=job, problem=f"JobFinished stored {n} times for attempt {attempt}")
        return inv

    def holds(self) -> tuple[list[Hold], list[dict[str, Any]]]:
        """Every attempt's hold on its GPUs, and the attempts whose release had to be inferred."""
        out: list[Hold] = []
        inferred: list[dict[str, Any]] = []
        attempts: dict[tuple[str, int], float] = {key: p.decided_at for key, p in self.placed.items()}
        for job, changes in self.changes.items():
            for c in changes:
                if c.record.placement is not None and c.record.state not in TERMINAL_STATES:
                    key = (job, c.record.placement.attempt)
                    if key in attempts:
                        attempts[key] = min(attempts[key], c.at)
        for (job, attempt), start in attempts.items():
            end, how = self._release(job, attempt)
            if how != "decision":
                inferred.append({"job": job, "attempt": attempt, "release": how})
            out.append(Hold(job, attempt, start, end, how))
        return out, inferred

    def _release(self, job: str, attempt: int) -> tuple[float, str]:
        seen_holding = False
        for c in self.changes.get(job, []):
            if holds(c.record, attempt):
                seen_holding = True
            elif seen_holding or c.record.attempt >= attempt:  # the attempt number moves only at a placement
                return c.at, "decision"
        record = self.ev.records.get(job)
        if record is not None and not holds(record, attempt):
            return record.updated_at, "stored record (its release decision is missing)"
        return math.inf, "never released"

    def no_gpu_held_twice(self) -> Invariant:
        inv = Invariant(
            "no_gpu_held_twice",
            "no GPU is held by two attempts at any instant (hold: placement decision until release decision)",
        )
        holds, _ = self.holds()
        by_slot: dict[str, list[Hold]] = defaultdict(list)
        gpus = {key: p.gpus for key, p in self.placed.items()}
        for job, changes in self.changes.items():
            for c in changes:
                if c.record.placement is not None:
                    gpus.setdefault((job, c.record.placement.attempt), c.record.placement.gpus)
        for hold in holds:
            for gpu in gpus.get((hold.job, hold.attempt), []):
                by_slot[gpu.slot].append(hold)
        for slot, slot_holds in sorted(by_slot.items()):
            slot_holds.sort(key=lambda h: (h.start, h.end))
            latest: Hold | None = None
            for hold in slot_holds:
                if latest is not None and hold.start < latest.end:
                    inv.violated(
                        gpu=slot,
                        first={
                            "job": latest.job,
                            "attempt": latest.attempt,
                            "from": latest.start,
                            "until": latest.end,
                            "release": latest.how,
                        },
                        second={"job": hold.job, "attempt": hold.attempt, "from": hold.start, "until": hold.end},
                        overlap_s=_r(min(latest.end, hold.end) - hold.start),
                    )
                if latest is None or hold.end > latest.end:
                    latest = hold
        return inv

    def gpu_hours_accounted(self) -> Invariant:
        inv = Invariant(
            "gpu_hours_accounted",
            "every succeeded job has started_at and run_s equal to its duration (its GPU-hours are counted)",
        )
        for job, record in sorted(self.ev.records.items()):
            if record.state.value != "succeeded":
                continue
            duration = record.spec.duration_s
            if record.started_at is None:
                inv.violated(
                    job=job,
                    problem="succeeded with started_at null",
                    run_s=record.run_s,
                    duration_s=duration,
                    attempt=record.attempt,
                    **self._story(job),
                )
            elif duration is not None and abs(record.run_s - duration) > RUN_TOLERANCE_S:
                inv.violated(
                    job=job,
                    problem="run_s differs from the duration",
                    run_s=_r(record.run_s),
                    duration_s=duration,
                    attempt=record.attempt,
                    **self._story(job),
                )
        return inv

    def _story(self, job: str) -> dict[str, Any]:
        """What the streams say about one job, for a violation's evidence."""
        events = [
            (type(e).__name__, getattr(e, "attempt", None))
            for e in self.ev.events
            if getattr(e, "job_id", None) == job and isinstance(e, JobStarted | JobFinished | JobStopped)
        ]
        changes = [(c.record.version, c.previous, c.record.state.value, c.record.attempt) for c in self.changes[job]]
        return {"executor_reports": events, "state_changes": changes}

    def jobs_seen_promptly(self) -> Invariant:
        inv = Invariant(
            "jobs_seen_within_10s",
            f"every submitted job has a record within {SEEN_BOUND_S:.0f} s of its submit (faults or not)",
        )
        for job, submitted in sorted(self.submitted.items()):
            changes = self.changes.get(job)
            if not changes or len(changes) >= HISTORY_KEPT:
                continue  # (the bucket keeps a record's last 64 versions: when it first was is not known)
            seen = min(c.at for c in changes)
            took = seen - submitted.submitted_at
            if took > SEEN_BOUND_S:
                inv.violated(
                    job=job,
                    seen_after_s=_r(took),
                    versions_kept=len(changes),
                    first_version_kept=min(c.record.version for c in changes),
                    submitted_t=_r(submitted.submitted_at - self.ev.started_at),
                    **self._nearest_fault(submitted.submitted_at),
                )
        return inv

    def _nearest_fault(self, at: float) -> dict[str, Any]:
        before = [f for f in self.ev.faults if f.at <= at + 1.0]
        if not before:
            return {}
        fault = max(before, key=lambda f: f.at)
        return {"last_fault": f"{fault.kind} {fault.target}".strip(), "submit_minus_fault_s": _r(at - fault.at)}

    def no_dead_letters(self) -> Invariant:
        inv = Invariant("no_dead_letters", "no consumer dead-lettered a message (every message here is well-formed)")
        for dl in self.ev.dead_letters:
            inv.violated(**dl)
        return inv

    def no_gpu_leaked(self) -> Invariant:
        inv = Invariant("no_gpu_leaked", "when every job has ended, the ledger holds no GPU")
        allocated = self.ev.gpus_allocated_at_end
        ended = all(r.state in TERMINAL_STATES for r in self.ev.records.values())
        if ended and allocated:
            inv.violated(gpus_allocated=allocated)
        return inv

    def recovery(self) -> tuple[dict[str, Any], Invariant]:
        inv = Invariant(
            "recovery_within_10s",
            f"after each fault, with work pending, the next placement or finish comes within {RECOVERY_BOUND_S:.0f} s",
        )
        progress = sorted(
            [p.decided_at for p in self.placed.values()]
            + [c.at for changes in self.changes.values() for c in changes if c.record.state in TERMINAL_STATES]
        )
        ended_at = {
            job: min((c.at for c in changes if c.record.state in TERMINAL_STATES), default=math.inf)
            for job, changes in self.changes.items()
        }
        rows = []
        for fault in sorted(self.ev.faults, key=lambda f: f.at):
            pending = any(s.submitted_at <= fault.at < ended_at.get(job, math.inf) for job, s in self.submitted.items())
            name = f"{fault.kind} {fault.target}".strip()
            row: dict[str, Any] = {"fault": name, "t": _r(fault.at - self.ev.started_at)}
            if fault.down_s:
                row["down_s"] = _r(fault.down_s)
            if not pending:
                row["recovery_s"] = None
            else:
                nxt = next((t for t in progress if t > fault.at), math.inf)
                row["recovery_s"] = _r(nxt - fault.at) if nxt < math.inf else "never"
                if nxt - fault.at > RECOVERY_BOUND_S:
                    inv.violated(**row)
            rows.append(row)
        figures = [r["recovery_s"] for r in rows if isinstance(r["recovery_s"], float)]
        summary: dict[str, Any] = {
            "faults_with_work_pending": len([r for r in rows if r["recovery_s"] is not None]),
            "max_s": max(figures, default=None),
            "p50_s": _r(statistics.median(figures)) if figures else None,
            "per_fault": rows,
        }
        return summary, inv

    def latencies(self) -> dict[str, Any]:
        """Submit to first placement, for people (not an invariant: it depends on the load)."""
        waits = []
        for (job, _), placed in self.placed.items():
            submitted = self.submitted.get(job)
            if submitted is not None:
                waits.append(placed.decided_at - submitted.submitted_at)
        if not waits:
            return {}
        waits.sort()
        return {
            "submit_to_first_placement_p50_s": _r(waits[len(waits) // 2]),
            "submit_to_first_placement_p99_s": _r(waits[min(len(waits) - 1, int(len(waits) * 0.99))]),
            "submit_to_first_placement_max_s": _r(waits[-1]),
        }


def _counts(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for item in items:
        out[item] += 1
    return dict(sorted(out.items()))


def check(evidence: Evidence) -> dict[str, Any]:
    """The report: `ok`, counts, each invariant with its violations, per-fault recovery and latencies."""
    return Checker(evidence).run()
