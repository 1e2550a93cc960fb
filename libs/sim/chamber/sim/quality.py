"""Scheduling quality from each job's timeline: queueing by size class, guarantee shortfall, fairness, and how
long a job waited while its team's guarantee would have covered it.

Every metric is computed exactly from when each job was submitted, when it held GPUs (one interval per attempt)
and when it finished, not from periodic samples, so a short shortfall is not missed between samples.

Definitions (per team `i` with a guarantee `g_i > 0`, at time `t`):
- `alloc_i(t)`: GPUs its jobs hold (running, or stopping within their grace);
- `demand_i(t)`: GPUs of its jobs in the system, holding or waiting (= `alloc_i(t)` + GPUs of its waiting jobs);
- **short** at `t` when `alloc_i(t) < min(demand_i(t), g_i)` (the issue's definition). A team whose only waiting
  job is wider than its unused guarantee counts as short, though no guarantee can start that job;
- **entitled-short** at `t` when one of its waiting jobs needs at most `g_i - alloc_i(t)` GPUs: the guarantee
  alone entitles that job to start now;
- **guarantee shortfall**: the summed length of every short episode lasting longer than `EPISODE_S` (30 min;
  the whole episode counts), over the teams' active time (time with `demand_i > 0`), summed over teams;
  `guarantee_shortfall_entitled` the same for entitled-short episodes;
- **fairness**: Jain's index `(sum x)^2 / (n sum x^2)` of `x_i = alloc_i / g_i` over the guaranteed teams with a
  job waiting (their share is the scheduler's doing, not limited by their own demand), at hourly instants where at
  least two such teams exist (contention), averaged over those instants (1 when every such team has the same
  share of its guarantee; 1/n when one team holds everything);
- **wait within guarantee** of a job of `k` GPUs: the time it spent waiting while `alloc_i + k <= g_i`, summed
  over its waits; the report gives the maximum over jobs.
"""

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

EPISODE_S = 1800.0
SAMPLE_S = 3600.0
SIZE_CLASSES: tuple[tuple[str, int, int], ...] = (("1", 1, 1), ("2-8", 2, 8), ("9-32", 9, 32), ("33+", 33, 1 << 30))


@dataclass(frozen=True, slots=True)
class Timeline:
    """One job as the report sees it: `runs` are the (start, end) of every attempt that held GPUs, in order;
    `finished` is when it ended for good (None: still in the system at the end)."""

    id: str
    team: str
    gpus: int
    submitted: float
    runs: tuple[tuple[float, float], ...]
    finished: float | None


def size_class(gpus: int) -> str:
    return next(name for name, low, high in SIZE_CLASSES if low <= gpus <= high)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def queueing_by_size(jobs: list[Timeline], end: float) -> dict[str, dict[str, Any]]:
    """Time from submission to first start per size class: average, p99, max. A job that never started counts
    with its wait so far (until `end`), so starvation shows instead of vanishing from the figures."""
    out: dict[str, dict[str, Any]] = {}
    for name, low, high in SIZE_CLASSES:
        mine = [j for j in jobs if low <= j.gpus <= high]
        waits = [(j.runs[0][0] if j.runs else end) - j.submitted for j in mine]
        out[name] = {
            "jobs": len(mine),
            "never_started": sum(1 for j in mine if not j.runs),
            "avg_s": round(statistics.fmean(waits), 1) if waits else 0.0,
            "p99_s": round(pct(waits, 0.99), 1),
            "max_s": round(max(waits, default=0.0), 1),
        }
    return out


@dataclass
class _Team:
    guarantee: int
    sizes: tuple[int, ...]
    alloc: int = 0
    waiting: Counter[int] = field(default_factory=Counter)
    last: float = 0.0
    cum: dict[int, float] = field(default_factory=dict)
    """size k -> time so far during which alloc + k <= guarantee (for waits within the guarantee)."""
    active_since: float | None = None
    short_since: float | None = None
    entitled_since: float | None = None
    active_s: float = 0.0
    short_s: float = 0.0
    entitled_s: float = 0.0

    def demand(self) -> int:
        return self.alloc + sum(k * n for k, n in self.waiting.items())

    def advance(self, t: float) -> None:
        for k in self.sizes:
            if self.alloc + k <= self.guarantee:
                self.cum[k] = self.cum.get(k, 0.0) + (t - self.last)
        self.last = t

    def settle(self, t: float) -> None:
        """Open or close the team's episodes at `t`, after every change at `t`."""
        demand = self.demand()
        short = self.alloc < min(demand, self.guarantee)
        smallest = min((k for k, n in self.waiting.items() if n > 0), default=None)
        entitled = smallest is not None and smallest <= self.guarantee - self.alloc
        if demand > 0 and self.active_since is None:
            self.active_since = t
        elif demand == 0 and self.active_since is not None:
            self.active_s += t - self.active_since
            self.active_since = None
        if short and self.short_since is None:
            self.short_since = t
        elif not short and self.short_since is not None:
            self.short_s += _episode(t - self.short_since)
            self.short_since = None
        if entitled and self.entitled_since is None:
            self.entitled_since = t
        elif not entitled and self.entitled_since is not None:
            self.entitled_s += _episode(t - self.entitled_since)
            self.entitled_since = None


def _episode(length: float) -> float:
    return length if length > EPISODE_S else 0.0


def guarantees(jobs: list[Timeline], quota: dict[str, int], start: float, end: float) -> dict[str, Any]:
    """Guarantee shortfall, fairness and waits within the guarantee (see the module's docstring), from `start`
    to `end`; teams without a guarantee are left out."""
    sizes: dict[str, set[int]] = {}
    for j in jobs:
        sizes.setdefault(j.team, set()).add(j.gpus)
    teams = {t: _Team(g, tuple(sorted(sizes.get(t, ()))), last=start) for t, g in quota.items() if g > 0}
    # (time, order, job index, change): at one instant every change applies before anything is measured.
    WAIT, STOP_WAIT, HOLD, RELEASE = 0, 1, 2, 3
    events: list[tuple[float, int, int]] = []
    for n, j in enumerate(jobs):
        if j.team not in teams:
            continue
        events.append((j.submitted, WAIT, n))
        for i, (a, b) in enumerate(j.runs):
            events += [(a, STOP_WAIT, n), (a, HOLD, n), (b, RELEASE, n)]
            if i + 1 < len(j.runs) or j.finished is None:
                events.append((b, WAIT, n))
    events.sort()
    wait_from: dict[int, float] = {}
    within: dict[int, float] = {}
    samples: list[float] = []
    next_sample = start
    i = 0
    while i < len(events):
        t = events[i][0]
        while next_sample < t and next_sample <= end:
            samples += _jain(teams)
            next_sample += SAMPLE_S
        touched: set[str] = set()
        while i < len(events) and events[i][0] == t:
            _, kind, n = events[i]
            j = jobs[n]
            team = teams[j.team]
            if j.team not in touched:
                team.advance(t)
                touched.add(j.team)
            if kind == WAIT:
                team.waiting[j.gpus] += 1
                wait_from[n] = team.cum.get(j.gpus, 0.0)
            elif kind == STOP_WAIT:
                team.waiting[j.gpus] -= 1
                within[n] = within.get(n, 0.0) + team.cum.get(j.gpus, 0.0) - wait_from.pop(n)
            elif kind == HOLD:
                team.alloc += j.gpus
            else:
                team.alloc -= j.gpus
            i += 1
        for name in touched:
            teams[name].settle(t)
    while next_sample <= end:
        samples += _jain(teams)
        next_sample += SAMPLE_S
    for n, w in wait_from.items():  # still waiting at the end
        team = teams[jobs[n].team]
        team.advance(end)
        within[n] = within.get(n, 0.0) + team.cum.get(jobs[n].gpus, 0.0) - w
    for team in teams.values():
        team.settle(end)
        if team.active_since is not None:
            team.active_s += end - team.active_since
        if team.short_since is not None:
            team.short_s += _episode(end - team.short_since)
        if team.entitled_since is not None:
            team.entitled_s += _episode(end - team.entitled_since)
    active = sum(t.active_s for t in teams.values())
    worst = max(within.items(), key=lambda kv: kv[1], default=None)
    return {
        "guarantee_shortfall": round(sum(t.short_s for t in teams.values()) / active, 5) if active else 0.0,
        "guarantee_shortfall_entitled": round(sum(t.entitled_s for t in teams.values()) / active, 5) if active else 0.0,
        "jain_fairness": round(statistics.fmean(samples), 4) if samples else 1.0,
        "contended_hours": len(samples) * SAMPLE_S / 3600,
        "max_wait_within_guarantee_s": round(worst[1], 1) if worst else 0.0,
        "max_wait_within_guarantee_job": jobs[worst[0]].id if worst else None,
        "team_shortfall": {
            name: {
                "active_h": round(t.active_s / 3600, 1),
                "short_h": round(t.short_s / 3600, 2),
                "entitled_short_h": round(t.entitled_s / 3600, 2),
            }
            for name, t in sorted(teams.items())
        },
    }


def _jain(teams: dict[str, _Team]) -> list[float]:
    shares = [t.alloc / t.guarantee for t in teams.values() if any(n > 0 for n in t.waiting.values())]
    if len(shares) < 2:
        return []
    return [jain(shares)]


def jain(values: list[float]) -> float:
    """Jain's fairness index of `values` (1: all equal; 1/n: one holds everything)."""
    squares = sum(x * x for x in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)
