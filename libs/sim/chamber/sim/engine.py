"""The discrete-event simulation: a virtual clock, the trace's arrivals, jobs finishing, preemptions and faults,
decided by the real scheduling core (`SchedulingState`) with the real quota arithmetic.

Decisions never see a job's true duration, only the estimate a user would give (when the scenario supplies one).
Policies:
- `fifo`: isolated virtual clusters (each team within its quota, no borrowing), strict FIFO per team, no
  preemption, no backfill (the Philly and Helios setup);
- `kueue`: cohort borrowing, best-effort FIFO (no reservations), classic preemption (reclaim of borrowed capacity;
  lower priority within a team);
- `chamber`: everything Chamber does: borrowing, reclaim, fair share, EASY backfill, best-fit topology-aware
  placement, preemption with checkpoint grace, health quarantine.
"""

import heapq
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import msgspec

from chamber.common.contracts import GpuRef, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.priorities import DEFAULT_CLASSES
from chamber.common.quota import QuotaBook, fair_shares, standings
from chamber.scheduler.core.cycle import SchedulerConfig, SchedulingState
from chamber.scheduler.core.decisions import Decision, Place, Preempt
from chamber.scheduler.core.model import PendingJob, Shape
from chamber.sim.faults import Fault, llama3_faults
from chamber.sim.scenario import Scenario, TraceJob

POLICIES: dict[str, SchedulerConfig] = {
    "fifo": SchedulerConfig(reservations=False, preemption=False, strict_fifo_per_team=True),
    "kueue": SchedulerConfig(reservations=False),
    "chamber": SchedulerConfig(),
}
STANDING_EVERY_S = 3600.0
SAMPLE_EVERY_S = 3600.0

# Event kinds, in the order they are handled at one instant.
FINISH, STOP, FAULT, REPAIR, FAIL, ARRIVE, CYCLE = range(7)


@dataclass
class SimJob:
    trace: TraceJob
    pending: PendingJob
    remaining_s: float
    attempt: int = 0
    started_at: float | None = None
    first_start: float | None = None
    finished_at: float | None = None
    gpus: tuple[GpuRef, ...] = ()
    stop_reason: str = ""
    preemptions: int = 0
    interruptions: int = 0
    lost_s: float = 0.0


@dataclass
class Stats:
    busy_gpu_s: float = 0.0
    down_intervals: list[tuple[float, float]] = field(default_factory=list)
    lost_gpu_s: float = 0.0
    lost_fault_gpu_s: float = 0.0
    preemptions: int = 0
    interruptions: int = 0
    faults: int = 0
    series: list[dict[str, Any]] = field(default_factory=list)


class Simulation:
    def __init__(self, scenario: Scenario, jobs: list[TraceJob], policy: str, events: IO[bytes] | None = None,
                 progress: Callable[[float], None] | None = None) -> None:  # fmt: skip
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        self.scenario = scenario
        self.policy = policy
        self.out = events
        self.progress = progress
        self.state = SchedulingState(POLICIES[policy])
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
        self.book = self._quota(scenario, policy)
        self.state.quota = self.book
        self.state.usage = type(self.state.usage)(self.book)
        self.jobs: dict[str, SimJob] = {}
        d = scenario.workload.defaults
        for tj in jobs:
            self.jobs[tj.id] = SimJob(tj, self._pending(tj, d.max_runtime_factor, d), tj.duration_s)
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.stats = Stats()
        self.down: dict[str, float] = {}
        """slot -> when it went down (quarantined)."""
        self.broken: dict[str, float] = {}
        """slot -> until when a faulty GPU stays in service undetected (health off, or a silent fault)."""
        self.rng = random.Random(scenario.faults.seed)
        self._cycle_pending = False
        self._last_cycle = -math.inf

    # ---- setup ----------------------------------------------------------------------------------------------

    def _quota(self, scenario: Scenario, policy: str) -> QuotaBook:
        pools = [PoolConfig(name=p.name, gpu_model=p.gpu_model, cost_per_gpu_hour=p.cost_per_gpu_hour)
                 for p in scenario.fleet.pools]  # fmt: skip
        teams = [
            TeamConfig(name=t.name, org="sim", cohort=t.cohort, weight=t.weight, quotas=[
                TeamQuota(pool=pool, nominal=n, borrowing_limit=0 if policy == "fifo" else t.borrowing_limit,
                          lending_limit=0 if policy == "fifo" else t.lending_limit)
                for pool, n in t.quota.items()
            ])
            for t in scenario.teams
        ]  # fmt: skip
        capacity = {p.name: p.nodes * p.gpus_per_node for p in scenario.fleet.pools}
        return QuotaBook(QuotaConfig(pools=pools, orgs=[OrgConfig(name="sim")], teams=teams), capacity)

    def _pending(self, tj: TraceJob, factor: float | None, d: Any) -> PendingJob:
        if tj.gpus > self.gpn:
            replicas = math.ceil(tj.gpus / self.gpn)
            per = math.ceil(tj.gpus / replicas)
        else:
            replicas, per = 1, tj.gpus
        pc = DEFAULT_CLASSES[tj.priority]
        return PendingJob(
            id=tj.id, team=tj.team, priority=pc.value, shape=Shape(per, replicas), submitted_at=tj.submit_s,
            preemptions=0, attempt=0, est_runtime_s=None if factor is None else tj.duration_s * factor,
            preemptible=tj.preemptible, checkpoint_interval_s=d.checkpoint_interval_s,
            checkpoint_grace_s=d.checkpoint_grace_s,
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
        done = 0
        while self.heap and done < len(self.jobs):
            at, kind, _, payload = heapq.heappop(self.heap)
            if at > horizon:
                break
            self._advance(at)
            while next_sample <= at:
                self._sample(next_sample)
                next_sample += SAMPLE_EVERY_S
            if self.policy == "chamber" and at >= next_standing:
                self._update_standing()
                next_standing = at + STANDING_EVERY_S
            if kind == ARRIVE:
                job = self.jobs[payload]
                self._log({"event": "submitted", "job": job.trace.id, "team": job.trace.team, "gpus": job.trace.gpus})
                self._apply(self.state.submit(job.pending, at))
                self._want_cycle()
            elif kind == FINISH:
                done += self._finish(*payload)
            elif kind in (STOP, FAIL):
                self._stop(*payload)
            elif kind == FAULT:
                self._fault(payload)
            elif kind == REPAIR:
                self._repair(payload)
            elif kind == CYCLE:
                self._cycle_pending = False
                self._last_cycle = at
                self._apply(self.state.cycle(at))
        self._advance(self.now)
        return time.perf_counter() - started

    def _advance(self, at: float) -> None:
        if self.progress is not None and at > self.now:
            self.progress(at - self.now)
        self.now = max(self.now, at)

    def _want_cycle(self) -> None:
        if not self._cycle_pending:
            self._cycle_pending = True
            self._push(max(self.now, self._last_cycle + self.scenario.cycle_interval_s), CYCLE, None)

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Place):
                job = self.jobs[d.job_id]
                job.attempt, job.gpus, job.started_at = d.attempt, d.gpus, self.now
                if job.first_start is None:
                    job.first_start = self.now
                self._log({"event": "started", "job": d.job_id, "placement": [[g.node, g.index] for g in d.gpus]})
                self._push(self.now + job.remaining_s, FINISH, (d.job_id, d.attempt))
                bad = [self.broken[g.slot] for g in d.gpus if g.slot in self.broken]
                if bad:  # an undetected faulty GPU fails the job soon after it starts
                    self._push(self.now + self.rng.uniform(60, 900), FAIL, (d.job_id, d.attempt, "faulty GPU", True))
            elif isinstance(d, Preempt):
                job = self.jobs[d.job_id]
                kind = "interrupted" if d.interrupt else "preempted"
                self._push(self.now + d.grace_s, STOP, (d.job_id, d.attempt, d.reason, d.interrupt or False))
                job.stop_reason = kind

    def _running(self, job_id: str, attempt: int) -> SimJob | None:
        job = self.jobs[job_id]
        run = self.state.running.get(job_id)
        if run is None or job.attempt != attempt or job.started_at is None:
            return None
        return job

    def _finish(self, job_id: str, attempt: int) -> int:
        job = self._running(job_id, attempt)
        if job is None:
            return 0
        self._account(job, job.remaining_s, 0.0)
        job.finished_at = self.now
        job.remaining_s = 0.0
        self.state.release(job_id)
        self._log({"event": "finished", "job": job_id})
        self._want_cycle()
        return 1

    def _stop(self, job_id: str, attempt: int, reason: str, fault: bool) -> None:
        job = self._running(job_id, attempt)
        if job is None:
            return
        assert job.started_at is not None
        ran = min(self.now - job.started_at, job.remaining_s)
        interval = job.pending.checkpoint_interval_s
        graceful = not fault and job.pending.checkpoint_grace_s > 0
        saved = ran if graceful and not interval else (ran - ran % interval if interval else 0.0)
        self._account(job, saved, ran - saved, fault=fault)
        job.remaining_s -= saved
        self.state.release(job_id)
        if fault:
            job.interruptions += 1
            self.stats.interruptions += 1
            self._log({"event": "interrupted", "job": job_id, "reason": reason})
        else:
            job.preemptions += 1
            self.stats.preemptions += 1
            self._log({"event": "preempted", "job": job_id})
        job.pending = job.pending.requeued(attempt, saved)
        job.started_at = None
        self.state.requeue(job.pending)
        self._want_cycle()

    def _account(self, job: SimJob, useful_s: float, lost_s: float, fault: bool = False) -> None:
        gpus = len(job.gpus)
        self.stats.busy_gpu_s += gpus * (useful_s + lost_s)
        self.stats.lost_gpu_s += gpus * lost_s
        if fault:
            self.stats.lost_fault_gpu_s += gpus * lost_s
        job.lost_s += lost_s

    # ---- faults ---------------------------------------------------------------------------------------------

    def _fault(self, fault: Fault) -> None:
        self.stats.faults += 1
        slot = self.slots[fault.gpu_number]
        node = slot.rsplit("/", 1)[0]
        cause = fault.cause
        victims = [r.id for r in self.state.running.values() if any(g.node == node for g in r.gpus)]
        if cause.scope == "gpu":
            victims = [r.id for r in self.state.running.values() if any(g.slot == slot for g in r.gpus)]
        if cause.scope == "job":
            for job_id in victims[:1]:
                self._stop(job_id, self.jobs[job_id].attempt, cause.name, True)
            return
        slots = [slot] if cause.scope == "gpu" else [s for s in self.slots if s.startswith(f"{node}/")]
        detected = self.scenario.faults.health and not cause.silent
        for job_id in victims:
            self._stop(job_id, self.jobs[job_id].attempt, cause.name, True)
        if detected:
            for s in slots:
                if s not in self.down:
                    self.down[s] = self.now
                    self.state.cordon(s, f"fatal: {cause.name}")
                    n, _, g = s.rpartition("/")
                    self._log({"event": "gpu_down", "node": n, "gpu": int(g)})
            self._push(self.now + cause.repair_s, REPAIR, slots)
        else:
            until = self.now + max(cause.repair_s, self.scenario.faults.manual_repair_s)
            for s in slots:
                self.broken[s] = until
            self._push(until, REPAIR, slots)

    def _repair(self, slots: list[str]) -> None:
        for s in slots:
            self.broken.pop(s, None)
            since = self.down.pop(s, None)
            if since is not None:
                self.stats.down_intervals.append((since, self.now))
                self.state.uncordon(s)
                n, _, g = s.rpartition("/")
                self._log({"event": "gpu_up", "node": n, "gpu": int(g)})
        self._want_cycle()

    # ---- fair share and sampling ----------------------------------------------------------------------------

    def _update_standing(self) -> None:
        demand: dict[tuple[str, str], int] = dict(self.state.usage.items())
        pool = self.scenario.fleet.pools[0].name
        for job in self.state.queue.jobs.values():
            key = (job.team, job.shape.pool or pool)
            demand[key] = demand.get(key, 0) + job.shape.gpus
        shares = fair_shares(self.book, demand)
        self.state.standing = standings(shares, dict(self.state.usage.items()))

    def _sample(self, at: float) -> None:
        busy = sum(len(r.gpus) for r in self.state.running.values())
        per_team: dict[str, int] = {}
        for r in self.state.running.values():
            per_team[r.team] = per_team.get(r.team, 0) + len(r.gpus)
        healthy = len(self.slots) - len(self.down)
        self.stats.series.append({
            "t": at, "busy": busy, "healthy": healthy, "queue": len(self.state.queue) + len(self.state.nominated),
            "teams": per_team,
        })  # fmt: skip
