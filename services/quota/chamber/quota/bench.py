"""`chamber bench quota`: the fair-share recompute and one admission check, on a seeded random configuration.

- `recompute_ms`: fair shares (water-filling per pool) and standings for every team, from demand and recent usage;
- `admission_check_us`: one `admit()` against incrementally kept cohort totals (what the scheduler does per job).
"""

import random
import statistics
import time

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaUsage, admit, fair_shares, standings, validate


def run(teams: int = 1000, pools: int = 8, seed: int = 1, repeats: int = 20, checks: int = 20_000) -> dict[str, float]:
    rng = random.Random(seed)
    pool_names = [f"pool-{i}" for i in range(pools)]
    capacity = {p: 8 * rng.randint(200, 2000) for p in pool_names}
    team_configs = []
    for i in range(teams):
        quotas = []
        for p in rng.sample(pool_names, k=rng.randint(1, min(3, pools))):
            nominal = rng.randint(0, capacity[p] // teams * 2)
            quotas.append(TeamQuota(pool=p, nominal=nominal, borrowing_limit=rng.choice([None, nominal, 64])))
        team_configs.append(
            TeamConfig(name=f"team-{i}", org=f"org-{i % 20}", cohort=f"cohort-{i % 10}",
                       weight=rng.choice([1.0, 2.0, 3.0]), quotas=quotas)
        )  # fmt: skip
    config = QuotaConfig(
        pools=[PoolConfig(name=p, gpu_model="H100") for p in pool_names],
        orgs=[OrgConfig(name=f"org-{i}") for i in range(20)],
        teams=team_configs,
    )
    t0 = time.perf_counter()
    book = validate(config, capacity)
    validate_ms = (time.perf_counter() - t0) * 1000
    demand = {(t.name, q.pool): rng.randint(0, 3 * q.nominal + 8) for t in team_configs for q in t.quotas}
    usage = {k: min(v, rng.randint(0, v)) for k, v in demand.items()}
    recent = {t.name: rng.uniform(0, 50) for t in team_configs}

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        shares = fair_shares(book, demand, recent)
        standings(shares, usage)
        times.append((time.perf_counter() - t0) * 1000)

    totals = QuotaUsage(book, usage)
    keys = list(demand)
    samples = [(*rng.choice(keys), rng.choice([1, 2, 4, 8, 16]), rng.random() < 0.6) for _ in range(checks)]
    t0 = time.perf_counter()
    admitted = 0
    for team, pool, gpus, preemptible in samples:
        admitted += admit(book, totals, team, pool, gpus, preemptible=preemptible).ok
    check_us = (time.perf_counter() - t0) * 1e6 / checks
    return {
        "teams": teams,
        "pools": pools,
        "validate_ms": round(validate_ms, 2),
        "recompute_ms": round(statistics.median(times), 3),
        "recompute_max_ms": round(max(times), 3),
        "admission_check_us": round(check_us, 2),
        "admitted_share": round(admitted / checks, 3),
    }
