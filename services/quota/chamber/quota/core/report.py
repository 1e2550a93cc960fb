"""What the quota service publishes per team: usage, borrowing, lending, fair share, standing, spend, budget.

Accounting is derived from the job records alone, so a restarted quota service recomputes exactly what it had:
GPU time = GPUs x (checkpointed run time + time lost to preemptions + the current attempt so far). Recent usage
for fair share decays with the configured half-life: a run from s to e at `now` weighs
integral of 2^-((now - t) / H) dt, expressed as an average number of GPUs.
"""

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Literal

from chamber.common.contracts import JobRecord, JobState, OrgUsage, TeamUsage
from chamber.common.quota import QuotaBook, fair_shares, standings

PENDING = (JobState.PENDING, JobState.PREEMPTED)


def period_start(period: str, now: float) -> float:
    t = datetime.fromtimestamp(now, UTC)
    day = t.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day.timestamp()
    if period == "week":
        return (day - timedelta(days=day.weekday())).timestamp()
    return day.replace(day=1).timestamp()


def gpu_seconds(record: JobRecord, now: float) -> float:
    ran = record.run_s + record.lost_s
    if record.state == JobState.RUNNING and record.started_at is not None:
        ran += max(0.0, now - record.started_at)
    return record.spec.gpus * ran


def recent_gpus(record: JobRecord, now: float, half_life_s: float) -> float:
    """The job's decayed recent usage, as an average number of GPUs over the decay's time constant."""
    if record.started_at is None:
        return 0.0
    end = now if record.state == JobState.RUNNING else (record.finished_at or record.updated_at)
    start = record.started_at - record.run_s - record.lost_s  # earlier attempts, approximated as contiguous
    k = math.log(2) / half_life_s
    weight = math.exp(-k * max(0.0, now - end)) - math.exp(-k * max(0.0, now - start))
    return record.spec.gpus * max(0.0, weight)


def pool_of(record: JobRecord, book: QuotaBook, node_pool: Mapping[str, str]) -> str:
    if record.placement is not None and record.placement.gpus:
        return node_pool.get(record.placement.gpus[0].node, "")
    if record.spec.pool:
        return record.spec.pool
    quotas = [p for (t, p) in book.quotas if t == record.spec.team]
    return quotas[0] if quotas else next(iter(sorted(book.capacity)), "")


def compute(
    book: QuotaBook, records: Iterable[JobRecord], node_pool: Mapping[str, str], now: float
) -> dict[str, TeamUsage]:
    usage: dict[tuple[str, str], int] = {}
    demand: dict[tuple[str, str], int] = {}
    counts: dict[str, list[int]] = {}
    seconds: dict[str, float] = {}
    by_pool: dict[str, dict[str, float]] = {}
    by_priority: dict[str, dict[str, float]] = {}
    cost: dict[str, float] = {}
    in_period: dict[str, tuple[float, float]] = {}
    recent: dict[str, float] = {}
    half_life = book.config.usage_half_life_s
    starts = {t.name: period_start(t.budget.period, now) for t in book.config.teams if t.budget}
    for r in records:
        team = r.spec.team
        pool = pool_of(r, book, node_pool)
        row = counts.setdefault(team, [0, 0, 0, 0])
        key = (team, pool)
        if r.state == JobState.RUNNING or (r.placement is not None and r.state in PENDING):
            usage[key] = usage.get(key, 0) + r.spec.gpus
            demand[key] = demand.get(key, 0) + r.spec.gpus
            row[0] += r.spec.gpus
            row[1] += 1
        elif r.state in PENDING:
            demand[key] = demand.get(key, 0) + r.spec.gpus
            row[2] += 1
            row[3] += r.spec.gpus
        used_s = gpu_seconds(r, now)
        price = book.pools[pool].cost_per_gpu_hour if pool in book.pools else 0.0
        seconds[team] = seconds.get(team, 0.0) + used_s
        if used_s:
            pools = by_pool.setdefault(team, {})
            pools[pool] = pools.get(pool, 0.0) + used_s / 3600
            prios = by_priority.setdefault(team, {})
            prios[r.spec.priority] = prios.get(r.spec.priority, 0.0) + used_s / 3600
        cost[team] = cost.get(team, 0.0) + used_s / 3600 * price
        if team in starts and (r.state == JobState.RUNNING or (r.finished_at or r.updated_at) >= starts[team]):
            h, c = in_period.get(team, (0.0, 0.0))
            in_period[team] = (h + used_s / 3600, c + used_s / 3600 * price)
        recent[team] = recent.get(team, 0.0) + recent_gpus(r, now, half_life)
    shares = fair_shares(book, demand, recent)
    stand = standings(shares, usage)
    teams = set(counts) | set(book.teams)
    out: dict[str, TeamUsage] = {}
    for team in sorted(teams):
        nominal = sum(q.nominal for (t, _), q in book.quotas.items() if t == team)
        borrowed = sum(max(0, u - book.quota(t, p).nominal) for (t, p), u in usage.items() if t == team)
        lent = _lent(book, usage, team)
        g, j, p, gp = counts.get(team, [0, 0, 0, 0])
        used_share, state = _budget(book, team, in_period.get(team, (0.0, 0.0)))
        out[team] = TeamUsage(
            team=team, gpus_running=g, jobs_running=j, jobs_pending=p, gpus_pending=gp, nominal=nominal,
            borrowed=borrowed, lent=lent,
            fair_share=round(sum(s for (t, _), s in shares.items() if t == team), 3),
            standing=round(stand.get(team, 0.0), 4), gpu_hours=round(seconds.get(team, 0.0) / 3600, 4),
            cost=round(cost.get(team, 0.0), 4), budget_used=round(used_share, 4), budget_state=state,
            gpu_hours_by_pool={p: round(h, 4) for p, h in by_pool.get(team, {}).items()},
            gpu_hours_by_priority={p: round(h, 4) for p, h in by_priority.get(team, {}).items()},
            org=book.teams[team].org if team in book.teams else "",
        )  # fmt: skip
    return out


def org_totals(book: QuotaBook, teams: Mapping[str, TeamUsage]) -> dict[str, OrgUsage]:
    """Every organisation's sums over the teams below it (at any depth of the hierarchy)."""
    acc: dict[str, list[float]] = {}
    for name, usage in teams.items():
        for org in book.org_path(name):
            row = acc.setdefault(org, [0, 0, 0, 0, 0.0, 0.0])
            for i, v in enumerate((1, usage.nominal, usage.gpus_running, usage.borrowed, usage.gpu_hours, usage.cost)):
                row[i] += v
    return {
        org: OrgUsage(org=org, teams=int(t), nominal=int(n), gpus_running=int(g), borrowed=int(b),
                      gpu_hours=round(h, 4), cost=round(c, 4))
        for org, (t, n, g, b, h, c) in sorted(acc.items())
    }  # fmt: skip


def _lent(book: QuotaBook, usage: Mapping[tuple[str, str], int], team: str) -> int:
    """GPUs of the team's idle nominal that borrowers in its cohort use now (shared in proportion)."""
    cohort = book.cohort_of(team)
    lent = 0.0
    for (t, pool), q in book.quotas.items():
        if t != team:
            continue
        cap = q.nominal if q.lending_limit is None else q.lending_limit
        mine = max(0, min(cap, q.nominal - usage.get((t, pool), 0)))
        idle = borrowed = 0
        for (t2, p2), q2 in book.quotas.items():
            if p2 != pool or book.cohort_of(t2) != cohort:
                continue
            used = usage.get((t2, p2), 0)
            cap2 = q2.nominal if q2.lending_limit is None else q2.lending_limit
            idle += max(0, min(cap2, q2.nominal - used))
            borrowed += max(0, used - q2.nominal)
        if idle:
            lent += mine * min(1.0, borrowed / idle)
    return round(lent)


BudgetState = Literal["none", "ok", "warn", "blocked-preemptible", "blocked-all"]
BLOCKED: dict[str, BudgetState] = {
    "warn": "warn",
    "block-preemptible": "blocked-preemptible",
    "block-all": "blocked-all",
}


def _budget(book: QuotaBook, team: str, spent: tuple[float, float]) -> tuple[float, BudgetState]:
    t = book.teams.get(team)
    if t is None or t.budget is None:
        return 0.0, "none"
    b = t.budget
    shares = []
    if b.gpu_hours:
        shares.append(spent[0] / b.gpu_hours)
    if b.money:
        shares.append(spent[1] / b.money)
    used = max(shares, default=0.0)
    if used < 1.0:
        return used, "warn" if used >= 0.8 else "ok"
    return used, BLOCKED[b.mode]
