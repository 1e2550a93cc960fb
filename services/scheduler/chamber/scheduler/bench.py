"""`chamber bench scheduler`: the real scheduling core on a seeded random fleet and workload, timed.

Measures, on one core:
- `placements_per_s`: placements per second of cycle time while jobs finish and new ones arrive (virtual time
  advances between cycles; only the time spent deciding is counted);
- `arrival_p50_ms` / `arrival_p99_ms`: one new job, submitted with ~100,000 waiting, to its decision;
- `preemption_plan_p99_ms`: a preemption plan for a high-priority job on a fleet full of preemptible work;
- `peak_rss_mb`: the process's peak resident memory.
"""

import gc
import heapq
import random
import resource
import statistics
import time
from dataclasses import dataclass, field

from chamber.common.priorities import DEFAULT_CLASSES
from chamber.scheduler.core.decisions import Decision, Place, Preempt, Wait
from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.preemption import plan_preemption
from chamber.scheduler.core.state import SchedulingState

SIZES = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4)]
SIZE_WEIGHTS = [30, 20, 15, 20, 10, 5]
CLASSES = ["inference", "train", "research", "best-effort"]
CLASS_WEIGHTS = [10, 30, 30, 30]


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


@dataclass
class Workload:
    rng: random.Random
    teams: int
    next_id: int = 0
    durations: dict[str, float] = field(default_factory=dict)

    def job(self, now: float, priority: str | None = None) -> PendingJob:
        per, replicas = self.rng.choices(SIZES, SIZE_WEIGHTS)[0]
        cls = priority or self.rng.choices(CLASSES, CLASS_WEIGHTS)[0]
        duration = min(48 * 3600.0, self.rng.lognormvariate(7.5, 1.2))
        estimate = duration * self.rng.uniform(1.0, 1.5) if self.rng.random() < 0.7 else None
        job_id = f"j{self.next_id}"
        self.next_id += 1
        self.durations[job_id] = duration
        pc = DEFAULT_CLASSES[cls]
        return PendingJob(
            id=job_id,
            team=f"team-{self.rng.randrange(self.teams)}",
            priority=pc.value,
            shape=Shape(per, replicas),
            submitted_at=now,
            preemptions=0,
            attempt=0,
            est_runtime_s=estimate,
            preemptible=pc.preemptible,
            checkpoint_grace_s=30.0,
            checkpoint_interval_s=1800.0,
        )


def build_fleet(cfg: BenchConfig) -> SchedulingState:
    state = SchedulingState()
    for i in range(cfg.nodes):
        rack = i // 16
        state.index.add_node(
            f"node-{i:05d}", pool="default", model="H100", rack=f"rack-{rack}", zone=f"zone-{rack // 8}",
            capacity=cfg.gpus_per_node, free=range(cfg.gpus_per_node),
        )  # fmt: skip
    return state


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _preemption_plans(cfg: BenchConfig, rng: random.Random, work: Workload) -> tuple[list[float], int]:
    """Plans for high-priority jobs on a fleet packed with preemptible work of every size and age."""
    state = build_fleet(cfg)
    now = 100_000.0
    filler = Workload(rng, cfg.teams)
    while True:
        job = filler.job(now - rng.uniform(0, 50_000), priority=rng.choice(["research", "best-effort"]))
        gpus = find_placement(state.index, job.shape)
        if gpus is None:
            if state.index.free_total() < 8:
                break
            continue
        for ref in gpus:
            state.index.take(ref.node, [ref.index])
        running = job.start(gpus, job.submitted_at)
        running.borrowed = rng.random() < 0.2
        state.running[job.id] = running
    plan_ms = []
    found = 0
    for _ in range(cfg.plans):
        job = work.job(now, priority=rng.choice(["train", "inference"]))
        t0 = time.perf_counter()
        plan = plan_preemption(state.index, job, state.running.values(), now)
        plan_ms.append((time.perf_counter() - t0) * 1000)
        found += plan is not None
    return plan_ms, found


def run(cfg: BenchConfig) -> dict[str, float | int | None]:
    rng = random.Random(cfg.seed)
    work = Workload(rng, cfg.teams)
    state = build_fleet(cfg)
    now = 0.0
    for _ in range(cfg.pending):
        state.queue.push(work.job(now))
    gc.collect()
    gc.freeze()

    finishes: list[tuple[float, str, int]] = []

    def apply(decisions: list[Decision], at: float) -> int:
        placed = 0
        for d in decisions:
            if isinstance(d, Place):
                placed += 1
                heapq.heappush(finishes, (at + work.durations[d.job_id], d.job_id, d.attempt))
            elif isinstance(d, Preempt):
                heapq.heappush(finishes, (at + d.grace_s, d.job_id, -d.attempt))
        return placed

    t0 = time.perf_counter()
    initial = apply(state.cycle(now), now)
    fill_ms = (time.perf_counter() - t0) * 1000

    placements = 0
    cycle_s = 0.0
    arrival_rate = cfg.pending / (cfg.cycles * cfg.step_s * 4)
    for _ in range(cfg.cycles):
        now += cfg.step_s
        while finishes and finishes[0][0] <= now:
            _, job_id, attempt = heapq.heappop(finishes)
            running = state.running.get(job_id)
            if running is None or running.attempt != abs(attempt):
                continue
            state.release(job_id)
        for _ in range(rng.randrange(int(2 * arrival_rate) + 1)):
            state.queue.push(work.job(now))
        t0 = time.perf_counter()
        decisions = state.cycle(now)
        cycle_s += time.perf_counter() - t0
        placements += apply(decisions, now)

    arrival_ms = []
    evaluated_ms = []
    for i in range(cfg.arrivals):
        job = work.job(now, priority="inference" if i % 10 == 0 else None)
        if i % 5 == 0:  # a team with nothing queued: its job is evaluated in full (placement, preemption, backfill)
            job.team = f"newcomer-{i}"
        t0 = time.perf_counter()
        decisions = state.submit(job, now)
        took = (time.perf_counter() - t0) * 1000
        arrival_ms.append(took)
        if not (len(decisions) == 1 and isinstance(decisions[0], Wait) and "queued behind" in decisions[0].reason):
            evaluated_ms.append(took)  # placed, preempted for, or blocked after a real attempt
        apply(decisions, now)

    plan_ms, found = _preemption_plans(cfg, rng, work)

    total_gpus = cfg.nodes * cfg.gpus_per_node
    busy = sum(len(r.gpus) for r in state.running.values())
    return {
        "nodes": cfg.nodes,
        "gpus": total_gpus,
        "pending_at_start": cfg.pending,
        "pending_at_end": len(state.queue),
        "initial_fill_placements": initial,
        "initial_fill_ms": round(fill_ms, 1),
        "cycles": cfg.cycles,
        "placements": placements,
        "placements_per_s": round(placements / cycle_s) if cycle_s else 0,
        "cycle_p50_ms": 0.0 if not cfg.cycles else round(1000 * cycle_s / cfg.cycles, 2),
        "arrival_p50_ms": round(statistics.median(arrival_ms), 3),
        "arrival_p99_ms": round(_pct(arrival_ms, 0.99), 3),
        "arrivals_evaluated": len(evaluated_ms),
        "arrival_evaluated_p99_ms": round(_pct(evaluated_ms, 0.99), 3) if evaluated_ms else None,
        "preemption_plan_p50_ms": round(statistics.median(plan_ms), 2),
        "preemption_plan_p99_ms": round(_pct(plan_ms, 0.99), 2),
        "preemption_plans_found": found,
        "allocation_ratio": round(busy / total_gpus, 4),
        "fragmented_gpus": state.index.fragmented_gpus(cfg.gpus_per_node),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
