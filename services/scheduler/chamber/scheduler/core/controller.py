"""The scheduler's whole pure state: the active job records and the scheduling state derived from them.

Both move together, through two doors only: `apply` (an event, through the job state machine) and `commit` (a
decision). The scheduler service persists what they return (ledger claims and releases, the jobs KV, decisions
on the bus, the executor); the simulator advances a virtual clock and plays the executor. Because both drive this
one object, borrowing, fair share, preemption, checkpoint accounting and the state machine cannot drift apart
between what Chamber simulates and what it does.

Only active jobs live here: a record that reaches a terminal state is dropped from memory (the KV keeps it), so
memory is bounded by the jobs that wait or run, not by history.
"""

from collections.abc import Iterable, Mapping

from chamber.common.contracts import (
    TERMINAL_STATES,
    Cordon,
    JobEvent,
    JobRecord,
    JobState,
    JobSubmitted,
    Node,
    Placement,
)
from chamber.common.quota import QuotaBook
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt, Wait
from chamber.scheduler.core.estimates import RuntimePredictor
from chamber.scheduler.core.lifecycle import (
    Transition,
    apply_event,
    grace_left,
    holds_gpus,
    nominate,
    note,
    place,
    stop_requested,
    unnominate,
)
from chamber.scheduler.core.model import pending_from, running_from
from chamber.scheduler.core.reasons import Reason, WaitKind
from chamber.scheduler.core.snapshot import build_state
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState

UNHELD = Reason(WaitKind.QUEUED, "queued: the GPUs held for it are no longer held")


class Controller:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.classes = dict(self.config.classes)
        self.records: dict[str, JobRecord] = {}
        """Active jobs only."""
        self.state = SchedulingState(self.config)

    def load(
        self,
        nodes: Iterable[Node],
        records: Iterable[JobRecord],
        owners: Mapping[str, str],
        cordons: Mapping[str, Cordon],
        *,
        quota: QuotaBook | None = None,
        standing: Mapping[str, float] | None = None,
        budget_blocks: Mapping[str, str] | None = None,
        predictor: RuntimePredictor | None = None,
    ) -> None:
        """Start from a snapshot: at start-up, and after the ledger was lost or found out of step. The runtime
        predictor is relearned from the records' finished jobs, unless one learned from them is given (a standby
        learns as they finish, and its snapshot then holds only the latest of them)."""
        records = list(records)
        active = [r for r in records if r.state not in TERMINAL_STATES]
        self.records = {r.id: r for r in active}
        if predictor is None:
            predictor = learned(records)  # relearned from the store: what it holds is the whole truth
        self.state = build_state(
            nodes, owners, cordons, active, standing=standing, quota=quota, budget_blocks=budget_blocks,
            config=self.config, predictor=predictor,
        )  # fmt: skip

    # ---- events ------------------------------------------------------------------------------------------------

    def apply(self, event: JobEvent, now: float) -> Transition | None:
        """The event through the job state machine; the scheduling state follows. None: nothing changed."""
        before = self.records.get(event.job_id)
        transition = apply_event(before, event, now)
        if transition is None:
            return None
        record = transition.record
        self._keep(record)
        if record.state == JobState.SUCCEEDED and (before is None or before.state != JobState.SUCCEEDED):
            observe(self.state.predictor, record)
        self._follow(before, transition)
        return transition

    def adopt(self, record: JobRecord) -> None:
        """A submission turned out to be a duplicate of a job already stored: `record` is what is stored."""
        self.forget(record.id)
        if record.state not in TERMINAL_STATES:
            self.records[record.id] = record
            self.state.add(pending_from(record, self.classes))

    def forget(self, job_id: str) -> None:
        self.records.pop(job_id, None)
        self.state.drop_move(job_id)
        if self.state.release(job_id) is None:
            self.state.withdraw(job_id)

    def replace(self, record: JobRecord) -> None:
        """Take `record` as the truth about its job (re-read from the store after a write was refused as stale):
        whatever the state believed about the job is dropped and rebuilt from the record (where another job held a
        GPU both name, because the ledger backs that one, it still does)."""
        before = self.state.running.get(record.id)
        yields = {g.slot for g in before.gpus if self.state.holder.get(g.slot) != record.id} if before else set()
        self.forget(record.id)
        if record.state in TERMINAL_STATES:
            return
        self.records[record.id] = record
        if holds_gpus(record):
            assert record.placement is not None
            pool = self.state.pool_of(record.placement.gpus[0].node)
            self.state.add_running(running_from(record, self.classes, pool=pool), yields=yields)
            if record.stopping and record.move_to:
                self.state.restore_move(record.id, tuple(record.move_to))
            return
        job = pending_from(record, self.classes)
        if job.nominated:
            self.state.add_nominated(job)
        else:
            if record.move_to:
                self.state.restore_move(record.id, tuple(record.move_to))
            self.state.requeue(job)  # to the GPUs held for it, if it was being moved and they still are

    def _keep(self, record: JobRecord) -> None:
        if record.state in TERMINAL_STATES:
            self.records.pop(record.id, None)
        else:
            self.records[record.id] = record

    def _follow(self, before: JobRecord | None, t: Transition) -> None:
        state, record = self.state, t.record
        if before is None:
            state.add(pending_from(record, self.classes))
            return
        if t.release_attempt is not None:
            state.release(record.id)
            if record.state not in TERMINAL_STATES:
                state.requeue(pending_from(record, self.classes))
            else:
                state.drop_move(record.id)
        elif record.state in TERMINAL_STATES:
            state.withdraw(record.id)  # it never held GPUs (cancelled while waiting)
        elif t.stop_attempt is not None:
            state.mark_stopping(record.id)
        elif record.state == JobState.RUNNING and record.started_at is not None:
            state.set_started(record.id, record.started_at)

    # ---- decisions ---------------------------------------------------------------------------------------------

    def decide(self, now: float) -> list[Decision]:
        return self._unheld(self.state.decide(now))

    def cycle(self, now: float) -> list[Decision]:
        return self._unheld(self.state.cycle(now))

    def _unheld(self, decisions: list[Decision]) -> list[Decision]:
        """A job put back in the queue after GPUs were held for it gets a decision even when the walk did not
        reach it (parked, behind its sub-queue's head, or the walk stopped early), so its record stops naming
        those GPUs: a restarted scheduler would otherwise hold them for it again."""
        unheld, self.state.unheld = self.state.unheld, set()
        if not unheld:
            return decisions
        decided = {d.job_id for d in decisions}
        for job_id in sorted(unheld - decided):
            record = self.records.get(job_id)
            if (
                record is not None
                and (record.nominated or record.move_to)
                and job_id not in self.state.nominated
                and job_id in self.state.queue.jobs
            ):
                decisions.append(Wait(job_id, UNHELD))
        return decisions

    def commit(self, decision: Decision, now: float) -> JobRecord | None:
        """The record as a decision changes it, for the shell to persist (a placement only once its ledger claim
        succeeded); None when it changes nothing."""
        record = self.records.get(decision.job_id)
        if record is None:
            return None
        if isinstance(decision, Place):
            changed = place(record, Placement(decision.attempt, list(decision.gpus), decision.reason), now)
        elif isinstance(decision, Nominate):
            changed = nominate(record, now, list(decision.gpus), decision.reason, list(decision.victims))
        elif isinstance(decision, Preempt):
            if record.attempt != decision.attempt or not holds_gpus(record):
                return None
            move_to = list(decision.move_to)
            if record.stopping:
                # Only a stop at once cuts a stop already asked for, and only one whose grace is not over (a GPU
                # failed during the job's checkpoint grace); a move it was stopping for stays.
                if decision.grace_s > 0 or record.cancel_requested or grace_left(record, now) <= 0:
                    return None
                move_to = move_to or list(record.move_to)
            changed = stop_requested(record, now, decision.reason, decision.interrupt, move_to,
                                     grace_s=decision.grace_s)  # fmt: skip
        else:
            return self._waiting(record, decision, now)
        self._keep(changed)
        return changed

    def _waiting(self, record: JobRecord, wait: Wait, now: float) -> JobRecord | None:
        why = wait.why
        if (record.nominated or record.move_to) and record.id not in self.state.nominated:
            record = unnominate(record, now)  # its preemption plan (or move) was dropped (a nominated GPU failed)
        elif (record.reason_kind, record.reason) == (why.kind, why.text):
            return None
        changed = note(record, now, why.text, why.kind)
        self._keep(changed)
        return changed

    def refuse(self, decision: Place) -> None:
        """The ledger refused a placement (the fleet moved under the decision): the job waits again."""
        record = self.records.get(decision.job_id)
        if record is not None and decision.job_id in self.state.running:
            self.state.unplace(decision.job_id, pending_from(record, self.classes))

    def submitted(self, event: JobSubmitted) -> bool:
        """Is this a submission of a job not known to be active? (The shell then checks the store.)"""
        return event.job_id not in self.records


def learned(records: Iterable[JobRecord]) -> RuntimePredictor:
    """A runtime predictor that has observed the records' succeeded jobs, in the order they finished."""
    predictor = RuntimePredictor()
    for done in sorted((r for r in records if r.state == JobState.SUCCEEDED), key=lambda r: r.finished_at or 0.0):
        observe(predictor, done)
    return predictor


def observe(predictor: RuntimePredictor, done: JobRecord) -> None:
    """The predictor learns from a job that succeeded."""
    spec = done.spec
    predictor.observe(spec.team, spec.name, spec.gpus_per_replica * spec.replicas, done.run_s)
