"""What the quota service publishes per team: usage, borrowing, lending, fair share, standing, spend, budget.

Accounting is derived from the job records alone, so a restarted quota service recomputes exactly what it had:
GPU time = GPUs x (checkpointed run time + time lost to preemptions + the current attempt so far). A record
keeps no time per attempt, so the earlier attempts are placed as one run just before the current attempt (or, for
a job not running, ending when it last ran or changed: `done_until`). A budget period counts the part of that
time inside [period start, now]. Recent usage for fair share decays with the configured half-life: a run from s
to e at `now` weighs integral of 2^-((now - t) / H) dt, expressed as an average number of GPUs.

`tally` sums every record from scratch (the definition); `chamber.quota.core.accounting` keeps the same sums up to
date one record change at a time (what the service runs). Both hand a `Tally` to `report`.
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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


def holds_gpus(record: JobRecord) -> bool:
    """Running, or placed and about to start: its GPUs count as used."""
    return record.state == JobState.RUNNING or (record.placement is not None and record.state in PENDING)


def waits(record: JobRecord) -> bool:
    return record.placement is None and record.state in PENDING


def running_since(record: JobRecord) -> float | None:
    """When the current attempt started, for a running job (its GPU time still grows)."""
    return record.started_at if record.state == JobState.RUNNING else None


def ended_at(record: JobRecord) -> float:
    """When a job that is not running last ran (what a budget period is compared with): its end, else when its
    last attempt stopped, else (a record from before `stopped_at` was kept) when it last changed. A job that ended
    without running again after its last stop (cancelled while it waited, its next launch failed for good) last ran
    when it stopped, not when it ended (found by review: cancelling a job preempted yesterday charged its run to
    today's budget)."""
    if record.started_at is None and record.stopped_at is not None:
        return record.stopped_at
    return record.finished_at or record.stopped_at or record.updated_at


def gpu_seconds(record: JobRecord, now: float) -> float:
    ran = record.run_s + record.lost_s
    since = running_since(record)
    if since is not None:
        ran += max(0.0, now - since)
    return record.spec.gpus * ran


def done_until(record: JobRecord) -> float:
    """When the job's finished GPU time (`run_s + lost_s`, earlier attempts) ends, taken as one contiguous run.

    The record keeps no time for each attempt, so the runs are placed as late as the record allows: for a running
    job, up to its current attempt's start; otherwise up to when it last ran (`ended_at`: its end, or for a
    preempted, requeued job the stop of its last attempt). Budgets (what part lies in the period) and recent usage
    (how far it has decayed) both read this placement, so they count exactly the GPU time `gpu_seconds` counts."""
    since = running_since(record)
    return since if since is not None else ended_at(record)


def done_after(record: JobRecord, start: float) -> float:
    """Seconds of the job's finished GPU time (per GPU) that lie after `start`, as `done_until` places them."""
    done = record.run_s + record.lost_s
    return min(done, max(0.0, done_until(record) - start))


def period_gpu_seconds(record: JobRecord, start: float, now: float) -> float:
    """The job's GPU time inside a budget period [start, now]: a job running for days charges a daily budget
    with today's hours only, not its whole life."""
    ran = done_after(record, start)
    since = running_since(record)
    if since is not None:
        ran += max(0.0, now - max(start, since))
    return record.spec.gpus * ran


def recent_gpus(record: JobRecord, now: float, half_life_s: float) -> float:
    """The job's decayed recent usage, as an average number of GPUs over the decay's time constant: its GPU time
    (the same as `gpu_seconds`) placed as `done_until` says, the current attempt running up to `now`."""
    end = now if running_since(record) is not None else ended_at(record)
    start = done_until(record) - record.run_s - record.lost_s
    if end <= start:
        return 0.0
    k = math.log(2) / half_life_s
    weight = math.exp(-k * max(0.0, now - end)) - math.exp(-k * max(0.0, now - start))
    return record.spec.gpus * max(0.0, weight)


def pool_of(record: JobRecord, book: QuotaBook, node_pool: Mapping[str, str]) -> str:
    if record.placement is not None and record.placement.gpus:
        return node_pool.get(record.placement.gpus[0].node, "")
    if record.spec.pool:
        return record.spec.pool
    quotas = book.team_pools.get(record.spec.team)
    return quotas[0] if quotas else book.first_pool


def price_of(book: QuotaBook, pool: str) -> float:
    return book.pools[pool].cost_per_gpu_hour if pool in book.pools else 0.0


@dataclass
class Tally:
    """Per-team sums over the job records at one moment (GPU-hours, not seconds)."""

    usage: dict[tuple[str, str], int] = field(default_factory=dict)
    demand: dict[tuple[str, str], int] = field(default_factory=dict)
    counts: dict[str, list[int]] = field(default_factory=dict)
    """team -> [GPUs running, jobs running, jobs pending, GPUs pending]."""
    hours: dict[str, float] = field(default_factory=dict)
    hours_by_pool: dict[str, dict[str, float]] = field(default_factory=dict)
    hours_by_priority: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    in_period: dict[str, tuple[float, float]] = field(default_factory=dict)
    """team (with a budget) -> (GPU-hours, cost) in the budget's current period."""
    recent: dict[str, float] = field(default_factory=dict)


def count(tally: Tally, record: JobRecord, pool: str, sign: int) -> None:
    """Add (sign 1) or take away (-1) what a record contributes to the GPU and job counts."""
    team, gpus = record.spec.team, record.spec.gpus
    key = (team, pool)
    row = tally.counts.setdefault(team, [0, 0, 0, 0])
    if holds_gpus(record):
        tally.usage[key] = tally.usage.get(key, 0) + sign * gpus
        tally.demand[key] = tally.demand.get(key, 0) + sign * gpus
        row[0] += sign * gpus
        row[1] += sign
    elif waits(record):
        tally.demand[key] = tally.demand.get(key, 0) + sign * gpus
        row[2] += sign
        row[3] += sign * gpus


def tally(book: QuotaBook, records: Iterable[JobRecord], node_pool: Mapping[str, str], now: float) -> Tally:
    """Every record's contribution at `now`, summed from scratch."""
    out = Tally()
    half_life = book.config.usage_half_life_s
    starts = {t.name: period_start(t.budget.period, now) for t in book.config.teams if t.budget}
    for r in records:
        team = r.spec.team
        pool = pool_of(r, book, node_pool)
        count(out, r, pool, 1)
        hours = gpu_seconds(r, now) / 3600
        price = price_of(book, pool)
        out.hours[team] = out.hours.get(team, 0.0) + hours
        if hours:
            pools = out.hours_by_pool.setdefault(team, {})
            pools[pool] = pools.get(pool, 0.0) + hours
            prios = out.hours_by_priority.setdefault(team, {})
            prios[r.spec.priority] = prios.get(r.spec.priority, 0.0) + hours
        out.cost[team] = out.cost.get(team, 0.0) + hours * price
        if team in starts:
            h, c = out.in_period.get(team, (0.0, 0.0))
            period_hours = period_gpu_seconds(r, starts[team], now) / 3600
            out.in_period[team] = (h + period_hours, c + period_hours * price)
        out.recent[team] = out.recent.get(team, 0.0) + recent_gpus(r, now, half_life)
    return out


def compute(
    book: QuotaBook, records: Iterable[JobRecord], node_pool: Mapping[str, str], now: float
) -> dict[str, TeamUsage]:
    """Every team's published usage, from scratch."""
    return report(book, tally(book, records, node_pool, now))


def report(book: QuotaBook, t: Tally) -> dict[str, TeamUsage]:
    shares = fair_shares(book, t.demand, t.recent)
    stand = standings(shares, t.usage)
    share_of: dict[str, float] = {}
    for (team, _), s in shares.items():
        share_of[team] = share_of.get(team, 0.0) + s
    nominal: dict[str, int] = {}
    for (team, _), q in book.quotas.items():
        nominal[team] = nominal.get(team, 0) + q.nominal
    borrowed: dict[str, int] = {}
    for (team, pool), used in t.usage.items():
        borrowed[team] = borrowed.get(team, 0) + max(0, used - book.quota(team, pool).nominal)
    lent = _lent(book, t.usage)
    out: dict[str, TeamUsage] = {}
    for team in sorted(set(t.counts) | set(book.teams)):
        g, j, p, gp = t.counts.get(team, [0, 0, 0, 0])
        used_share, state = _budget(book, team, t.in_period.get(team, (0.0, 0.0)))
        out[team] = TeamUsage(
            team=team, gpus_running=g, jobs_running=j, jobs_pending=p, gpus_pending=gp, nominal=nominal.get(team, 0),
            borrowed=borrowed.get(team, 0), lent=lent.get(team, 0),
            fair_share=round(share_of.get(team, 0.0), 3),
            standing=round(stand.get(team, 0.0), 4), gpu_hours=round(t.hours.get(team, 0.0), 4),
            cost=round(t.cost.get(team, 0.0), 4), budget_used=round(used_share, 4), budget_state=state,
            gpu_hours_by_pool={p: round(h, 4) for p, h in t.hours_by_pool.get(team, {}).items()},
            gpu_hours_by_priority={p: round(h, 4) for p, h in t.hours_by_priority.get(team, {}).items()},
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


def _lent(book: QuotaBook, usage: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Per team: GPUs of its idle nominal that borrowers in its cohort use now (shared in proportion)."""
    idle: dict[tuple[str, str], int] = {}  # (pool, cohort) -> idle lendable nominal
    borrowed: dict[tuple[str, str], int] = {}  # (pool, cohort) -> usage above nominal
    mine: dict[tuple[str, str], int] = {}  # (team, pool) -> its idle lendable nominal
    for (team, pool), q in book.quotas.items():
        used = usage.get((team, pool), 0)
        cap = q.nominal if q.lending_limit is None else q.lending_limit
        cohort = (pool, book.cohort_of(team))
        mine[(team, pool)] = max(0, min(cap, q.nominal - used))
        idle[cohort] = idle.get(cohort, 0) + mine[(team, pool)]
        borrowed[cohort] = borrowed.get(cohort, 0) + max(0, used - q.nominal)
    lent: dict[str, float] = {}
    for (team, pool), m in mine.items():
        cohort = (pool, book.cohort_of(team))
        if idle[cohort]:
            lent[team] = lent.get(team, 0.0) + m * min(1.0, borrowed[cohort] / idle[cohort])
        else:
            lent.setdefault(team, 0.0)
    return {team: round(v) for team, v in lent.items()}


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
