"""`chamber bench scheduler`: the real scheduling core on a seeded random fleet and workload, timed.

Times are CPU time of this process (`time.process_time`), so other load on the machine does not inflate them. The
garbage collector runs as in the scheduler service (`GC_THRESHOLDS`; before, the default thresholds spent ~10% of
the `--quota` case's time collecting).

Measures, on one core:
- `placements_per_s`: placements per second of cycle time while jobs finish and new ones arrive (virtual time
  advances between cycles; only the time spent deciding is counted); `cycle_p50_ms`/`cycle_p99_ms` per cycle;
- `arrival_p50_ms` / `arrival_p99_ms`: one new job, submitted with ~100,000 waiting, to its decision;
- `preemption_plan_p99_ms`: a preemption plan for a high-priority job on a fleet full of preemptible work, also
  when every victim costs the same (`..._ties_`), and one cycle with 200 preemptors arriving at once;
- `peak_rss_mb`: the process's peak resident memory;
- `core`: "compiled" (mypyc, as a wheel installs it) or "python" (an editable install): see `setup.py`.

Harder cases, by flag: `--quota` (1,000 teams in cohorts, nominal below capacity so teams borrow and reclaim),
`--preemptible-backlog` (the fleet starts full of preemptible work and the queue is of higher priority: most
placements need a preemption first), `--topology` (a third of the gangs want one rack, some one node).
"""

import gc
import heapq
import random
import resource
import statistics
import time
from dataclasses import dataclass, field

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.priorities import DEFAULT_CLASSES
from chamber.common.quota import QuotaBook
from chamber.common.runtime import GC_THRESHOLDS
from chamber.scheduler.core import build
from chamber.scheduler.core.decisions import Decision, Nominate, Place, Preempt, Wait
from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.reasons import WaitKind
from chamber.scheduler.core.state import SchedulingState

SIZES = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4)]
SIZE_WEIGHTS = [30, 20, 15, 20, 10, 5]
CLASSES = ["inference", "train", "research", "best-effort"]
CLASS_WEIGHTS = [10, 30, 30, 30]
NODES_PER_RACK = 16


@dataclass
class BenchConfig:
    nodes: int = 1280
    gpus_per_node: int = 8
    pending: int = 100_000
    teams: int = 20
    seed: int = 1
    cycles: int = 200
    step_s: float = 60.0
    arrivals: int = 2000
    plans: int = 200
    quota: bool = False
    preemptible_backlog: bool = False
    topology: bool = False
    preemptors: int = 200


@dataclass
class Workload:
    rng: random.Random
    teams: int
    topology: bool = False
    prefix: str = "j"
    next_id: int = 0
    durations: dict[str, float] = field(default_factory=dict)
    jobs: dict[str, PendingJob] = field(default_factory=dict)

    def job(self, now: float, priority: str | None = None, *, ties: bool = False) -> PendingJob:
        per, replicas = self.rng.choices(SIZES, SIZE_WEIGHTS)[0]
        cls = priority or self.rng.choices(CLASSES, CLASS_WEIGHTS)[0]
        duration = min(48 * 3600.0, self.rng.lognormvariate(7.5, 1.2))
        estimate = duration * self.rng.uniform(1.0, 1.5) if self.rng.random() < 0.7 else None
        job_id = f"{self.prefix}{self.next_id}"
        self.next_id += 1
        self.durations[job_id] = duration
        pc = DEFAULT_CLASSES[cls]
        level = None
        if self.topology and replicas > 1 and self.rng.random() < 0.34:
            level = "rack"
        elif self.topology and replicas == 1 and per < 8 and self.rng.random() < 0.2:
            level = "node"
        job = self.jobs[job_id] = PendingJob(
            id=job_id,
            team=f"team-{self.rng.randrange(self.teams)}",
            priority=pc.value,
            shape=Shape(per, replicas, level=level),
            submitted_at=now,
            preemptions=0,
            attempt=0,
            est_runtime_s=estimate,
            preemptible=pc.preemptible,
            checkpoint_grace_s=30.0,
            checkpoint_interval_s=None if ties else 1800.0,
        )
        return job


def build_fleet(cfg: BenchConfig) -> SchedulingState:
    state = SchedulingState()
    for i in range(cfg.nodes):
        rack = i // NODES_PER_RACK
        state.index.add_node(
            f"node-{i:05d}", pool="default", model="H100", rack=f"rack-{rack}", zone=f"zone-{rack // 8}",
            capacity=cfg.gpus_per_node, free=range(cfg.gpus_per_node),
        )  # fmt: skip
    if cfg.quota:
        state.set_quota(quota_book(cfg))
    return state


def quota_book(cfg: BenchConfig) -> QuotaBook:
    """`cfg.teams` teams in cohorts of 10, guarantees summing to 80% of the fleet: teams borrow what others leave."""
    capacity = cfg.nodes * cfg.gpus_per_node
    nominal = max(1, int(0.8 * capacity / cfg.teams))
    teams = [
        TeamConfig(name=f"team-{i}", org="bench", cohort=f"cohort-{i // 10}",
                   quotas=[TeamQuota(pool="default", nominal=nominal)])
        for i in range(cfg.teams)
    ]  # fmt: skip
    config = QuotaConfig(pools=[PoolConfig(name="default", gpu_model="H100")], orgs=[OrgConfig(name="bench")],
                         teams=teams)  # fmt: skip
    return QuotaBook(config, {"default": capacity})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _pack(state: SchedulingState, rng: random.Random, filler: Workload, now: float, *, ties: bool = False) -> None:
    """Fill the fleet with preemptible work of every size and age (each job placed as the cycle would)."""
    while True:
        job = filler.job(now - rng.uniform(0, 50_000), priority=rng.choice(["research", "best-effort"]), ties=ties)
        job.shape = Shape(job.shape.per_replica, job.shape.replicas)
        if ties:
            job.priority, job.shape = DEFAULT_CLASSES["research"].value, Shape(1, 1)
        gpus = find_placement(state.index, job.shape)
        if gpus is None:
            if state.index.free_total() < 8:
                return
            continue
        state.place(job, gpus, "packed", job.submitted_at, borrowing=rng.random() < 0.2)


def _preemption_plans(
    cfg: BenchConfig, rng: random.Random, work: Workload, *, ties: bool
) -> tuple[list[float], int, float]:
    """High-priority arrivals on a fleet packed with preemptible work (`ties`: every victim costs the same), each
    decided as the scheduler decides an arrival: placement fails, a preemption plan is made and committed. The
    victims are sorted by cost once per cycle context; the first plan pays for that sort (returned apart)."""
    gc.collect()  # the earlier phases' garbage is not this phase's to collect (a full collection takes ~80 ms)
    state = build_fleet(BenchConfig(nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node, teams=cfg.teams))
    now = 100_000.0
    _pack(state, rng, Workload(rng, cfg.teams, prefix="p"), now, ties=ties)
    state.cycle(now)
    plan_ms = []
    found = 0
    for _ in range(cfg.plans + 1):
        job = work.job(now, priority=rng.choice(["train", "inference"]))
        job.shape = Shape(job.shape.per_replica, job.shape.replicas)
        job.team = f"preemptor-{job.id}"  # alone in its sub-queue: decided in full
        t0 = time.process_time()
        decisions = state.submit(job, now)
        plan_ms.append((time.process_time() - t0) * 1000)
        found += any(isinstance(d, Nominate) for d in decisions)
    return plan_ms[1:], found, plan_ms[0]


def _preemptor_cycle(cfg: BenchConfig, rng: random.Random) -> tuple[float, int]:
    """One cycle in which `cfg.preemptors` high-priority jobs arrive on a fleet packed with preemptible work."""
    gc.collect()  # as in `_preemption_plans`
    state = build_fleet(BenchConfig(nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node, teams=cfg.teams))
    now = 100_000.0
    _pack(state, rng, Workload(rng, cfg.teams), now)
    work = Workload(rng, cfg.teams)
    for _ in range(cfg.preemptors):
        job = work.job(now, priority="train")
        job.shape = Shape(job.shape.per_replica, job.shape.replicas)
        state.add(job)
    t0 = time.process_time()
    decisions = state.cycle(now)
    took = (time.process_time() - t0) * 1000
    return took, sum(isinstance(d, Nominate) for d in decisions)


def run(cfg: BenchConfig) -> dict[str, float | int | str | None]:
    rng = random.Random(cfg.seed)
    work = Workload(rng, cfg.teams, topology=cfg.topology)
    state = build_fleet(cfg)
    now = 0.0
    filler = Workload(rng, cfg.teams, prefix="f")
    if cfg.preemptible_backlog:
        _pack(state, rng, filler, now)
    for _ in range(cfg.pending):
        job = work.job(now, priority="train" if cfg.preemptible_backlog and rng.random() < 0.5 else None)
        state.add(job)
    state.arrivals.clear()
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)  # the core as the scheduler service runs it: with its GC settings
    try:
        return _measure(cfg, rng, work=work, state=state, filler=filler, now=now)
    finally:
        gc.set_threshold(*thresholds)


def _measure(
    cfg: BenchConfig, rng: random.Random, *, work: Workload, state: SchedulingState, filler: Workload, now: float
) -> dict[str, float | int | str | None]:
    """The timed phases of `run`, on the fleet and queue it built."""
    finishes: list[tuple[float, str, int]] = []
    counts = {"placed": 0, "preempted": 0}

    def apply(decisions: list[Decision], at: float) -> int:
        placed = 0
        for d in decisions:
            if isinstance(d, Place):
                placed += 1
                heapq.heappush(finishes, (at + work.durations.get(d.job_id, 3600.0), d.job_id, d.attempt))
            elif isinstance(d, Preempt):
                counts["preempted"] += 1
                heapq.heappush(finishes, (at + d.grace_s, d.job_id, -d.attempt))
        return placed

    t0 = time.process_time()
    initial = apply(state.cycle(now), now)
    fill_ms = (time.process_time() - t0) * 1000

    placements = 0
    cycle_ms: list[float] = []
    arrival_rate = cfg.pending / (cfg.cycles * cfg.step_s * 4)
    for _ in range(cfg.cycles):
        now += cfg.step_s
        while finishes and finishes[0][0] <= now:
            _, job_id, attempt = heapq.heappop(finishes)
            running = state.running.get(job_id)
            if running is None or running.attempt != abs(attempt):
                continue
            ended = state.release(job_id)
            if attempt < 0 and ended is not None:  # preempted: back to the queue, to resume from its checkpoint
                job = work.jobs.get(job_id) or filler.jobs[job_id]
                state.requeue(job.requeued(ended.attempt, now - ended.started_at))
        for _ in range(rng.randrange(int(2 * arrival_rate) + 1)):
            state.add(work.job(now))
        t0 = time.process_time()
        decisions = state.cycle(now)
        cycle_ms.append((time.process_time() - t0) * 1000)
        placements += apply(decisions, now)

    arrival_ms = []
    evaluated_ms = []
    for i in range(cfg.arrivals):
        job = work.job(now, priority="inference" if i % 10 == 0 else None)
        if i % 5 == 0:  # a team with nothing queued: its job is evaluated in full (placement, preemption, backfill)
            job.team = f"newcomer-{i}"
        t0 = time.process_time()
        decisions = state.submit(job, now)
        took = (time.process_time() - t0) * 1000
        arrival_ms.append(took)
        if not (len(decisions) == 1 and isinstance(decisions[0], Wait) and decisions[0].why.kind == WaitKind.QUEUED):
            evaluated_ms.append(took)  # placed, preempted for, or blocked after a real attempt
        apply(decisions, now)

    plan_ms, found, first_ms = _preemption_plans(cfg, rng, work, ties=False)
    ties_ms, ties_found, ties_first_ms = _preemption_plans(cfg, rng, work, ties=True)
    preemptor_cycle_ms, preemptors_nominated = _preemptor_cycle(cfg, rng)

    total_gpus = cfg.nodes * cfg.gpus_per_node
    busy = sum(len(r.gpus) for r in state.running.values())
    cycle_s = sum(cycle_ms) / 1000
    hard = [name for name, on in (("quota", cfg.quota), ("preemptible-backlog", cfg.preemptible_backlog),
                                  ("topology", cfg.topology)) if on]  # fmt: skip
    return {
        "case": "+".join(hard) or "default",
        "nodes": cfg.nodes,
        "gpus": total_gpus,
        "teams": cfg.teams,
        "pending_at_start": cfg.pending,
        "pending_at_end": len(state.queue),
        "initial_fill_placements": initial,
        "initial_fill_ms": round(fill_ms, 1),
        "cycles": cfg.cycles,
        "placements": placements,
        "preemptions": counts["preempted"],
        "placements_per_s": round(placements / cycle_s) if cycle_s else 0,
        "cycle_p50_ms": round(statistics.median(cycle_ms), 2) if cycle_ms else 0.0,
        "cycle_p99_ms": round(_pct(cycle_ms, 0.99), 2),
        "arrival_p50_ms": round(statistics.median(arrival_ms), 3),
        "arrival_p99_ms": round(_pct(arrival_ms, 0.99), 3),
        "arrivals_evaluated": len(evaluated_ms),
        "arrival_evaluated_p99_ms": round(_pct(evaluated_ms, 0.99), 3) if evaluated_ms else None,
        "preemption_plan_p50_ms": round(statistics.median(plan_ms), 2),
        "preemption_plan_p99_ms": round(_pct(plan_ms, 0.99), 2),
        "preemption_plans_found": found,
        "preemption_first_plan_ms": round(first_ms, 2),
        "preemption_plan_ties_p99_ms": round(_pct(ties_ms, 0.99), 2),
        "preemption_first_plan_ties_ms": round(ties_first_ms, 2),
        "preemption_plans_ties_found": ties_found,
        "preemptor_cycle_ms": round(preemptor_cycle_ms, 1),
        "preemptors_nominated": preemptors_nominated,
        "allocation_ratio": round(busy / total_gpus, 4),
        "fragmented_gpus": state.index.fragmented_gpus(cfg.gpus_per_node),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "core": build(),
    }
