"""The discrete-event simulation: a virtual clock, the trace's arrivals, jobs finishing, preemptions and faults,
decided by the real scheduling core (`SchedulingState`) with the real quota arithmetic.

Decisions never see a job's true duration, only the estimate a user would give (when the scenario supplies one)
and what the runtime predictor learned from jobs that finished before. Policies (see `POLICIES`):
- `fifo`: one shared queue, strict FIFO (a blocked head blocks everyone), no quotas, no preemption, no backfill;
- `isolated`: each team on its own quota, no borrowing, strict FIFO per team, no preemption, no backfill (the
  Philly and Helios setup);
- `kueue`: cohort borrowing, best-effort FIFO (no reservations), classic preemption (reclaim of borrowed capacity;
  lower priority within a team);
- `fair-fifo`: Chamber's earlier order: borrowing, reclaim, fair share, then submit time; EASY backfill on the
  users' estimates;
- `spf`: fair share, then shortest predicted GPU-time first (learned runtimes, Helios's QSSF); EASY backfill on
  the users' estimates; age protection (Chamber's default before consolidation);
- `spf-drain`: `spf` with 8 sticky reservations and backfill on the smaller of the user's estimate and the
  prediction;
- `qssf`: shortest predicted GPU-time before fair share, otherwise as `spf`;
- `las`: fair share, then least attained GPU-time first (Tiresias, no estimates needed); EASY backfill on the
  users' estimates; age protection;
- `chamber`: what Chamber runs by default (the scheduler's `SchedulerConfig()`), the winner of the comparison in
  docs/simulator.md: shortest predicted GPU-time first, then fair share (guarantees first by the quota's two
  passes and reclaim); EASY backfill on the smaller of the user's estimate and the prediction; consolidation
  (small jobs moved to open room for multi-GPU ones); reclaim past a guarantee (a team below its guarantee
  reclaims for its smallest waiting job even when it is wider than what is left of the guarantee); age protection.
"""

import heapq
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Literal

import msgspec

from chamber.common.contracts import (
    TERMINAL_STATES,
    Cordon,
    GpuRef,
    JobEvent,
    JobFinished,
    JobRecord,
    JobSpec,
    JobStarted,
    JobStopped,
    JobSubmitted,
    OrgConfig,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
)
from chamber.common.priorities import DEFAULT_CLASSES
from chamber.common.quota import QuotaBook, fair_shares, standings
from chamber.scheduler.core.controller import Controller
from chamber.scheduler.core.decisions import Decision, Place, Preempt, Wait
from chamber.scheduler.core.state import SchedulerConfig
from chamber.sim.faults import Fault, llama3_faults
from chamber.sim.scenario import Scenario, TraceJob
from chamber.sim.synth import estimate


@dataclass(frozen=True)
class Policy:
    config: SchedulerConfig
    quotas: Literal["shared", "isolated", "none"] = "shared"
    """Team quotas in their cohorts (borrowing), each team on its own quota only, or no quotas at all."""
    fair_share: bool = True
    """Order teams by fair-share standing (recomputed hourly from demand, as the quota service does)."""


def _before_consolidation(**changes: Any) -> SchedulerConfig:
    """Every comparison policy runs without what came with consolidation (moves, backfill on predictions, the
    rank before fair share) and after it (reclaim past a guarantee), so that it stays what its name says while
    the default moves on."""
    return SchedulerConfig(consolidate=False, backfill_on_predictions=False, rank_first=False,
                           reclaim_past_guarantee=False, **changes)  # fmt: skip


POLICIES: dict[str, Policy] = {
    "fifo": Policy(
        _before_consolidation(max_reservations=0, preemption=False, strict_fifo=True, order="fifo",
                              predict=False, max_wait_s=None),
        quotas="none", fair_share=False,
    ),
    "isolated": Policy(
        _before_consolidation(max_reservations=0, preemption=False, strict_fifo_per_team=True, order="fifo",
                              predict=False, max_wait_s=None),
        quotas="isolated", fair_share=False,
    ),
    "kueue": Policy(_before_consolidation(max_reservations=0, order="fifo", predict=False, max_wait_s=None),
                    fair_share=False),
    "fair-fifo": Policy(_before_consolidation(order="fifo", predict=False, max_wait_s=None, max_reservations=1,
                                              sticky_reservations="none")),
    "spf": Policy(_before_consolidation()),
    "spf-drain": Policy(
        SchedulerConfig(order="spf", max_reservations=8, sticky_reservations="all", consolidate=False,
                        backfill_on_predictions=True, rank_first=False, reclaim_past_guarantee=False)
    ),
    "qssf": Policy(SchedulerConfig(order="spf", consolidate=False, backfill_on_predictions=False, rank_first=True,
                                   reclaim_past_guarantee=False)),
    "las": Policy(_before_consolidation(order="las", predict=False)),
    "chamber": Policy(SchedulerConfig()),
}  # fmt: skip
STANDING_EVERY_S = 3600.0
SAMPLE_EVERY_S = 3600.0

# Event kinds, in the order they are handled at one instant.
FINISH, STOP, FAULT, REPAIR, FAIL, ARRIVE, CYCLE = range(7)


@dataclass
class SimJob:
    trace: TraceJob
    spec: JobSpec
    first_start: float | None = None
    finished_at: float | None = None
    gpus: tuple[GpuRef, ...] = ()
    preemptions: int = 0
    interruptions: int = 0
    lost_s: float = 0.0
    runs: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of every attempt that held GPUs and has released them (the report's timelines)."""


@dataclass
class Stats:
    busy_gpu_s: float = 0.0
    down_intervals: list[tuple[float, float]] = field(default_factory=list)
    lost_gpu_s: float = 0.0
    lost_fault_gpu_s: float = 0.0
    preemptions: int = 0
    moves: int = 0
    """Of the preemptions, those that moved a job to open room for another (consolidation)."""
    interruptions: int = 0
    faults: int = 0
    series: list[dict[str, Any]] = field(default_factory=list)


class Simulation:
    """Drives the scheduler's `Controller` (the same object the scheduler service drives) on a virtual clock, and
    plays the executor: a placed job starts at once, finishes when its true duration has run, and stops after
    its grace when preempted. The job records it accounts from are the state machine's, as in the service."""

    def __init__(self, scenario: Scenario, jobs: list[TraceJob], policy: str, events: IO[bytes] | None = None,
                 progress: Callable[[float], None] | None = None) -> None:  # fmt: skip
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        self.scenario = scenario
        self.policy = policy
        self.out = events
        self.progress = progress
        self.rules = POLICIES[policy]
        self.control = Controller(self.rules.config)
        self.state = self.control.state
        self.gpn = scenario.fleet.pools[0].gpus_per_node
        self.slots: list[str] = []
        self.pool_of_node: dict[str, str] = {}
        i = 0
        for pool in scenario.fleet.pools:
            for _ in range(pool.nodes):
                name = f"{pool.name}-{i:04d}"
                rack = i // pool.nodes_per_rack
                self.state.index.add_node(
                    name, pool=pool.name, model=pool.gpu_model, rack=f"rack-{rack}", zone="zone-0",
                    capacity=pool.gpus_per_node, free=range(pool.gpus_per_node),
                )  # fmt: skip
                self.pool_of_node[name] = pool.name
                self.slots += [f"{name}/{g}" for g in range(pool.gpus_per_node)]
                i += 1
        self.book = self._quota(scenario, self.rules.quotas == "isolated")
        if self.rules.quotas != "none":
            self.state.set_quota(self.book)
        self.jobs: dict[str, SimJob] = {}
        d = scenario.workload.defaults
        for tj in jobs:
            self.jobs[tj.id] = SimJob(tj, self._spec(tj, d.max_runtime_factor, d))
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.stats = Stats()
        self.down: dict[str, float] = {}
        """slot -> when it went down (quarantined)."""
        self.broken: dict[str, float] = {}
        """slot -> until when a faulty GPU stays in service undetected (health off, or a silent fault)."""
        self.rng = random.Random(scenario.faults.seed)
        self._cycle_at: float | None = None
        self.done = 0

    # ---- setup ----------------------------------------------------------------------------------------------

    def _quota(self, scenario: Scenario, isolated: bool) -> QuotaBook:
        pools = [PoolConfig(name=p.name, gpu_model=p.gpu_model, cost_per_gpu_hour=p.cost_per_gpu_hour)
                 for p in scenario.fleet.pools]  # fmt: skip
        teams = [
            TeamConfig(name=t.name, org="sim", cohort=t.cohort, weight=t.weight, quotas=[
                TeamQuota(pool=pool, nominal=n, borrowing_limit=0 if isolated else t.borrowing_limit,
                          lending_limit=0 if isolated else t.lending_limit)
                for pool, n in t.quota.items()
            ])
            for t in scenario.teams
        ]  # fmt: skip
        capacity = {p.name: p.nodes * p.gpus_per_node for p in scenario.fleet.pools}
        return QuotaBook(QuotaConfig(pools=pools, orgs=[OrgConfig(name="sim")], teams=teams), capacity)

    def _spec(self, tj: TraceJob, factor: float | None, d: Any) -> JobSpec:
        if tj.gpus > self.gpn:
            replicas = math.ceil(tj.gpus / self.gpn)
            per = math.ceil(tj.gpus / replicas)
        else:
            replicas, per = 1, tj.gpus
        return JobSpec(
            name=tj.id, team=tj.team, gpus_per_replica=per, replicas=replicas, priority=tj.priority,
            duration_s=tj.duration_s,
            max_runtime_s=estimate(self.scenario.workload.estimates, tj.id, tj.duration_s, factor),
            checkpoint_interval_s=d.checkpoint_interval_s, checkpoint_grace_s=d.checkpoint_grace_s,
            preemptible=tj.preemptible if tj.preemptible != DEFAULT_CLASSES[tj.priority].preemptible else None,
        )  # fmt: skip

    def _push(self, at: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (at, kind, self._seq, payload))

    def _log(self, event: dict[str, Any]) -> None:
        if self.out is not None:
            self.out.write(msgspec.json.encode({"t": round(self.now, 3), **event}) + b"\n")

    # ---- the loop -------------------------------------------------------------------------------------------

    def run(self) -> float:
        started = time.perf_counter()
        for job in self.jobs.values():
            self._push(job.trace.submit_s, ARRIVE, job.trace.id)
        horizon = max((j.trace.submit_s for j in self.jobs.values()), default=0.0) + 400 * 86400
        if self.scenario.faults.model == "llama3":
            last_arrival = max((j.trace.submit_s for j in self.jobs.values()), default=0.0)
            for fault in llama3_faults(len(self.slots), last_arrival + 30 * 86400, self.scenario.faults.rate_multiplier,
                                       self.scenario.faults.seed):  # fmt: skip
                self._push(fault.at, FAULT, fault)
        next_sample = 0.0
        next_standing = 0.0
        while self.heap and self.done < len(self.jobs):
            at, kind, _, payload = heapq.heappop(self.heap)
            if at > horizon:
                break
            self._advance(at)
            while next_sample <= at:
                self._sample(next_sample)
                next_sample += SAMPLE_EVERY_S
            if self.rules.fair_share and at >= next_standing:
                self._update_standing()
                next_standing = at + STANDING_EVERY_S
            if kind == ARRIVE:
                job = self.jobs[payload]
                self._log({"event": "submitted", "job": job.trace.id, "team": job.trace.team, "gpus": job.trace.gpus})
                self._event(JobSubmitted(job_id=payload, spec=job.spec, submitted_at=at))
            elif kind in (FINISH, STOP, FAIL):
                self._event(payload)
            elif kind == FAULT:
                self._fault(payload)
            elif kind == REPAIR:
                self._repair(payload)
            elif kind == CYCLE:
                self._cycle_at = None
                self.state.invalidate()
            if not self.heap or self.heap[0][0] > at:
                self._decide(periodic=kind == CYCLE)  # this instant is complete: decide, as the service does
        self._advance(self.now)
        return time.perf_counter() - started

    def _advance(self, at: float) -> None:
        if self.progress is not None and at > self.now:
            self.progress(at - self.now)
        self.now = max(self.now, at)

    def _decide(self, periodic: bool) -> None:
        decisions = self.control.decide(self.now)
        self._apply(decisions)
        acted = any(not isinstance(d, Wait) for d in decisions)
        waiting = len(self.state.queue) or self.state.nominated
        if waiting and self._cycle_at is None and (acted or not periodic):
            # The safety-net cycle, as the service runs it: time alone changes what is possible (minimum runtimes
            # pass, estimates run out). Once one found nothing to do, the next event brings the next one.
            self._cycle_at = self.now + self.scenario.cycle_interval_s
            self._push(self._cycle_at, CYCLE, None)

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            change = self.control.commit(d, self.now)
            if isinstance(d, Place):
                job = self.jobs[d.job_id]
                job.gpus = d.gpus
                if job.first_start is None:
                    job.first_start = self.now
                self._log({"event": "started", "job": d.job_id, "placement": [[g.node, g.index] for g in d.gpus]})
                self._event(JobStarted(job_id=d.job_id, attempt=d.attempt, started_at=self.now))
                record = self.control.records[d.job_id]
                remaining = max(0.0, job.trace.duration_s - record.run_s)
                end = self.now + remaining
                finish = JobFinished(job_id=d.job_id, attempt=d.attempt, finished_at=end, started_at=self.now)
                self._push(end, FINISH, finish)
                bad = [self.broken[g.slot] for g in d.gpus if g.slot in self.broken]
                if bad:  # an undetected faulty GPU fails the job soon after it starts
                    at = self.now + self.rng.uniform(60, 900)
                    self._push(at, FAIL, JobStopped(
                        job_id=d.job_id, attempt=d.attempt, stopped_at=at, reason="faulty GPU", graceful=False,
                        started_at=self.now, interrupted=True))  # fmt: skip
            elif isinstance(d, Preempt) and change is not None:
                self.stats.moves += d.move
                at = self.now + d.grace_s
                stop = JobStopped(
                    job_id=d.job_id, attempt=d.attempt, stopped_at=at, reason=d.reason, graceful=d.grace_s > 0
                )
                self._push(at, STOP, stop)

    def _event(self, event: JobEvent) -> None:
        """An event through the controller, as the service's consumer hands it over; the log and the accounting
        follow the record's change."""
        before = self.control.records.get(event.job_id)
        transition = self.control.apply(event, self.now)
        if transition is None:
            return
        record = transition.record
        if before is None or transition.release_attempt is None:
            return
        self._account(self.jobs[record.id], before, record)

    def _account(self, job: SimJob, before: JobRecord, after: JobRecord) -> None:
        gpus = len(job.gpus)
        useful = after.run_s - before.run_s
        lost = after.lost_s - before.lost_s
        self.stats.busy_gpu_s += gpus * (useful + lost)
        self.stats.lost_gpu_s += gpus * lost
        job.lost_s += lost
        job.runs.append((before.started_at if before.started_at is not None else self.now, self.now))
        if after.state in TERMINAL_STATES:
            job.finished_at = self.now
            self.done += 1
            self._log({"event": "finished", "job": job.trace.id})
        elif after.interruptions > before.interruptions:
            job.interruptions += 1
            self.stats.interruptions += 1
            self.stats.lost_fault_gpu_s += gpus * lost
            self._log({"event": "interrupted", "job": job.trace.id, "reason": after.stop_reason})
        else:
            job.preemptions += 1
            self.stats.preemptions += 1
            self._log({"event": "preempted", "job": job.trace.id})

    # ---- faults ---------------------------------------------------------------------------------------------

    def _fault(self, fault: Fault) -> None:
        """A fault as health would see it: detected ones cordon the GPU (or node), and the scheduler interrupts
        whatever runs there; undetected ones (health off, silent corruption) kill the jobs and stay in service."""
        self.stats.faults += 1
        slot = self.slots[fault.gpu_number]
        node = slot.rsplit("/", 1)[0]
        cause = fault.cause
        on_node = [r.id for r in self.state.running.values() if any(g.node == node for g in r.gpus)]
        if cause.scope == "job":
            for job_id in on_node[:1]:
                self._kill(job_id, cause.name)
            return
        slots = [slot] if cause.scope == "gpu" else [s for s in self.slots if s.startswith(f"{node}/")]
        if self.scenario.faults.health and not cause.silent:
            for s in slots:
                if s not in self.down:
                    self.down[s] = self.now
                    self.state.cordon(s, Cordon(severity="fatal", reason=cause.name))
                    n, _, g = s.rpartition("/")
                    self._log({"event": "gpu_down", "node": n, "gpu": int(g)})
            self._push(self.now + cause.repair_s, REPAIR, slots)
            return
        hit = set(slots)
        for job_id in on_node:
            if any(g.slot in hit for g in self.state.running[job_id].gpus):
                self._kill(job_id, cause.name)
        until = self.now + max(cause.repair_s, self.scenario.faults.manual_repair_s)
        for s in slots:
            self.broken[s] = until
        self._push(until, REPAIR, slots)

    def _kill(self, job_id: str, cause: str) -> None:
        record = self.control.records[job_id]
        self._event(JobStopped(
            job_id=job_id, attempt=record.attempt, stopped_at=self.now, reason=cause, graceful=False,
            started_at=record.started_at, interrupted=True,
        ))  # fmt: skip

    def _repair(self, slots: list[str]) -> None:
        for s in slots:
            self.broken.pop(s, None)
            since = self.down.pop(s, None)
            if since is not None:
                self.stats.down_intervals.append((since, self.now))
                self.state.uncordon(s)
                n, _, g = s.rpartition("/")
                self._log({"event": "gpu_up", "node": n, "gpu": int(g)})

    # ---- fair share and sampling ----------------------------------------------------------------------------

    def _update_standing(self) -> None:
        demand: dict[tuple[str, str], int] = dict(self.state.usage.items())
        pool = self.scenario.fleet.pools[0].name
        for job in self.state.queue.jobs.values():
            key = (job.team, job.shape.pool or pool)
            demand[key] = demand.get(key, 0) + job.shape.gpus
        shares = fair_shares(self.book, demand)
        self.state.standing = standings(shares, dict(self.state.usage.items()))
        self.state.invalidate()

    def _sample(self, at: float) -> None:
        busy = sum(len(r.gpus) for r in self.state.running.values())
        per_team: dict[str, int] = {}
        for r in self.state.running.values():
            per_team[r.team] = per_team.get(r.team, 0) + len(r.gpus)
        demand = dict(per_team)
        for q in (*self.state.queue.jobs.values(), *self.state.nominated.values()):
            demand[q.team] = demand.get(q.team, 0) + q.shape.gpus
        healthy = len(self.slots) - len(self.down)
        self.stats.series.append({
            "t": at, "busy": busy, "healthy": healthy, "queue": len(self.state.queue) + len(self.state.nominated),
            "teams": per_team, "demand": demand,
        })  # fmt: skip
