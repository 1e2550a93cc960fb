"""`chamber bench quota`: fair shares, admission and the quota service's accounting, at scale and under pressure.

A seeded random configuration (`teams` teams over `pools` pools, 1 to 3 pools each, several cohorts), demand at
`demand` x each pool's capacity (above 1 the water-filling has to share a real surplus), and `jobs` job records.

- `recompute_ms`: fair shares (water-filling per pool) and standings for every team, from demand and recent usage;
- `admission_check_us`: one `admit()` against incrementally kept cohort totals (what the scheduler does per job);
- `service_update_ms` (median, `_p99`): one job state change applied to the quota service's accounting built from
  `jobs` records (what it does for each change of a record it follows; it keeps the records of jobs not ended);
- `publish_ms`: the whole published state (every team's usage, fair share, standing, budget) from that
  accounting; `from_scratch_ms`: the same from every record (what a restart does once);
- `records_kept`: the records the accounting holds after the changes (those of jobs not ended: what bounds the
  quota service's memory).

Times are the CPU time of this thread (`time.thread_time`): what one core spends, however busy the machine is.
"""

import random
import statistics
import time

import msgspec

from chamber.common.contracts import (
    TERMINAL_STATES,
    BudgetSpec,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    OrgConfig,
    Placement,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
)
from chamber.common.quota import QuotaBook, QuotaUsage, admit, fair_shares, standings, validate
from chamber.quota.core.accounting import Accounting
from chamber.quota.core.report import compute, org_totals

NOW = 1_800_000_000.0
GPUS_PER_NODE = 8


def _config(rng: random.Random, teams: int, pools: int) -> tuple[QuotaConfig, dict[str, int]]:
    pool_names = [f"pool-{i}" for i in range(pools)]
    capacity = {p: GPUS_PER_NODE * rng.randint(200, 2000) for p in pool_names}
    team_configs = []
    for i in range(teams):
        quotas = []
        for p in rng.sample(pool_names, k=rng.randint(1, min(3, pools))):
            nominal = rng.randint(0, capacity[p] // teams * 2)
            quotas.append(TeamQuota(pool=p, nominal=nominal, borrowing_limit=rng.choice([None, nominal, 64])))
        budget = BudgetSpec(gpu_hours=rng.uniform(1e3, 1e5), period="month") if i % 4 == 0 else None
        team_configs.append(
            TeamConfig(name=f"team-{i}", org=f"org-{i % 20}", cohort=f"cohort-{i % 10}",
                       weight=rng.choice([1.0, 2.0, 3.0]), quotas=quotas, budget=budget)
        )  # fmt: skip
    config = QuotaConfig(
        pools=[PoolConfig(name=p, gpu_model="H100", cost_per_gpu_hour=rng.uniform(1, 4)) for p in pool_names],
        orgs=[OrgConfig(name=f"org-{i}") for i in range(20)],
        teams=team_configs,
    )
    return config, capacity


def _demand(rng: random.Random, book: QuotaBook, factor: float) -> dict[tuple[str, str], int]:
    """Per pool, `factor` x its capacity spread over the teams with a quota there (random shares)."""
    demand: dict[tuple[str, str], int] = {}
    by_pool: dict[str, list[str]] = {}
    for team, pool in book.quotas:
        by_pool.setdefault(pool, []).append(team)
    for pool, members in by_pool.items():
        weights = [rng.random() for _ in members]
        total = sum(weights) or 1.0
        for team, w in zip(members, weights, strict=True):
            demand[(team, pool)] = round(factor * book.capacity[pool] * w / total)
    return demand


def _records(rng: random.Random, book: QuotaBook, jobs: int) -> tuple[list[JobRecord], dict[str, str]]:
    """`jobs` records: the running ones fill about 90% of each pool, the rest wait or have finished."""
    keys = list(book.quotas)
    free = {p: int(0.9 * c) for p, c in book.capacity.items()}
    node_pool: dict[str, str] = {}
    next_node: dict[str, int] = {}
    out = []
    for i in range(jobs):
        team, pool = rng.choice(keys)
        gpus = rng.choice([1, 2, 4, 8])
        spec = JobSpec(name=f"j{i}", team=team, gpus_per_replica=gpus, pool=pool,
                       priority=rng.choice(["train", "research", "best-effort"]))  # fmt: skip
        started = NOW - rng.uniform(0, 30 * 86400)
        if free[pool] >= gpus:
            free[pool] -= gpus
            n = next_node.get(pool, 0)
            next_node[pool] = n + 1
            node = f"{pool}-node-{n}"
            node_pool[node] = pool
            out.append(JobRecord(id=spec.name, spec=spec, state=JobState.RUNNING, submitted_at=started,
                                 updated_at=started, placement=Placement(attempt=1, gpus=[GpuRef(node, 0)]),
                                 started_at=started, version=2))  # fmt: skip
        elif rng.random() < 0.5:
            out.append(JobRecord(id=spec.name, spec=spec, state=JobState.PENDING, submitted_at=started,
                                 updated_at=started))  # fmt: skip
        else:
            ran = rng.uniform(60, 86400)
            out.append(JobRecord(id=spec.name, spec=spec, state=JobState.SUCCEEDED, submitted_at=started,
                                 updated_at=started + ran, started_at=started, finished_at=started + ran,
                                 run_s=ran, version=3))  # fmt: skip
    return out, node_pool


def _next_version(rng: random.Random, r: JobRecord, now: float) -> JobRecord:
    """The record after one plausible state change (start, finish, or preemption)."""
    if r.state == JobState.RUNNING:
        state = rng.choice([JobState.SUCCEEDED, JobState.PREEMPTED])
        ran = now - (r.started_at or now)
        return msgspec.structs.replace(r, state=state, version=r.version + 1, updated_at=now, run_s=r.run_s + ran,
                                       finished_at=now if state == JobState.SUCCEEDED else None,
                                       placement=None)  # fmt: skip
    if r.state in (JobState.PENDING, JobState.PREEMPTED):
        return msgspec.structs.replace(r, state=JobState.RUNNING, version=r.version + 1, updated_at=now,
                                       started_at=now, placement=Placement(attempt=r.attempt + 1,
                                                                           gpus=[GpuRef("spare", 0)]))  # fmt: skip
    raise ValueError(f"job {r.id} has ended: its record changes no more")


def run(
    *,
    teams: int = 1000,
    pools: int = 8,
    seed: int = 1,
    demand: float = 3.0,
    jobs: int = 100_000,
    repeats: int = 20,
    checks: int = 20_000,
    updates: int = 5_000,
) -> dict[str, float]:
    rng = random.Random(seed)
    config, capacity = _config(rng, teams, pools)
    t0 = time.thread_time()
    book = validate(config, capacity)
    validate_ms = (time.thread_time() - t0) * 1000
    wanted = _demand(rng, book, demand)
    usage = {k: min(v, rng.randint(0, v)) for k, v in wanted.items()}
    recent = {t.name: rng.uniform(0, 50) for t in config.teams}

    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        shares = fair_shares(book, wanted, recent)
        standings(shares, usage)
        times.append((time.thread_time() - t0) * 1000)

    totals = QuotaUsage(book, usage)
    keys = list(wanted)
    samples = [(*rng.choice(keys), rng.choice([1, 2, 4, 8, 16]), rng.random() < 0.6) for _ in range(checks)]
    t0 = time.thread_time()
    admitted = 0
    for team, pool, gpus, preemptible in samples:
        admitted += admit(book, totals, team, pool, gpus, preemptible=preemptible).ok
    check_us = (time.thread_time() - t0) * 1e6 / checks

    records, node_pool = _records(rng, book, jobs)
    node_pool["spare"] = config.pools[0].name
    t0 = time.thread_time()
    teams_scratch = compute(book, records, node_pool, NOW)
    from_scratch_ms = (time.thread_time() - t0) * 1000
    acc = Accounting.build(book, node_pool, records, NOW)
    current = {r.id: r for r in records}
    ids = [r.id for r in records if r.state not in TERMINAL_STATES]  # (an ended job changes no more)
    changes = []
    for i in range(updates):
        at = rng.randrange(len(ids))
        job = ids[at]
        current[job] = _next_version(rng, current[job], NOW + i)
        changes.append(current[job])
        if current[job].state in TERMINAL_STATES:
            ids[at] = ids[-1]
            ids.pop()
    update_ms = []
    for i, record in enumerate(changes):
        t0 = time.thread_time()
        acc.apply(record, NOW + i)
        update_ms.append((time.thread_time() - t0) * 1000)
    publish = []
    for _ in range(5):
        t0 = time.thread_time()
        org_totals(book, acc.teams(NOW + updates, book))
        publish.append((time.thread_time() - t0) * 1000)
    update_ms.sort()
    return {
        "teams": teams,
        "pools": pools,
        "demand_x_capacity": demand,
        "validate_ms": round(validate_ms, 2),
        "recompute_ms": round(statistics.median(times), 3),
        "recompute_max_ms": round(max(times), 3),
        "admission_check_us": round(check_us, 2),
        "admitted_share": round(admitted / checks, 3),
        "jobs": jobs,
        "teams_reported": len(teams_scratch),
        "service_update_ms": round(statistics.median(update_ms), 4),
        "service_update_p99_ms": round(update_ms[int(0.99 * (len(update_ms) - 1))], 4),
        "publish_ms": round(statistics.median(publish), 2),
        "from_scratch_ms": round(from_scratch_ms, 1),
        "records_kept": len(acc.records),
    }
