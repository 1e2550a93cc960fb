"""The quota service's accounting, kept up to date one job state change at a time.

Recomputing every team's usage from every job record each second costs O(jobs). Instead each record change takes
the record's previous contribution away and adds its new one, in O(1), and publishing reads the sums at `now`.

What grows with time is linear or exponential in `now`, so it is kept as coefficients:
- a running job's GPU time, gpus x (now - started), is kept as sum(gpus) and sum(gpus x (started - epoch));
- a finished run's decayed usage, gpus x (e^-k(now-end) - e^-k(now-start)), is e^-k(now-epoch) times the constant
  gpus x (e^k(end-epoch) - e^k(start-epoch)); a running one's is gpus - e^-k(now-epoch) x gpus x e^k(start-epoch).
The epoch moves forward (and the exponential sums are rescaled) before e^k(t-epoch) could lose precision.
A budget period counts a record's finished GPU time after the period start (a constant) and its current attempt
from max(period start, attempt start): both fit the same linear form. When the period start moves (a new day,
week or month), the teams concerned are summed again from their records.

Memory is bounded by the jobs that have not ended. A job that has ended (succeeded, failed or cancelled, its end
not in the future) never changes again, so its record settles: its contribution stays in the sums and the record
is let go (the jobs KV keeps it). What a settled job adds to the sums is fixed from then on but for one thing, the
part of its GPU time inside a budget period, which a new period recounts from the records; a new period starts
after the job ended, so it holds nothing of it (a record settles only once the period it is applied in is the
current one, see `_roll`). What changes the sums of settled jobs, a new configuration (prices, periods, half-life)
or a node that moved to another pool, means reading the records again (`Quota` does, from the KV); a node new to
the inventory only re-sums the jobs not settled (`with_nodes`), unless a settled job ran on it before it was known
(`settled_on_unknown`).

This equals `report.tally` (the definition, from scratch) over every record, settled ones included, for records
whose times are not in the future and a clock that does not go back; the property tests in
tests/unit/quota/test_accounting.py hold it to that.
"""

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from chamber.common.contracts import TERMINAL_STATES, JobRecord, TeamUsage
from chamber.common.quota import QuotaBook
from chamber.quota.core.report import (
    Tally,
    count,
    done_after,
    done_until,
    ended_at,
    period_start,
    pool_of,
    price_of,
    report,
    running_since,
)

MIN_REPORTED_HOURS = 1e-9
REBASE_EXPONENT = 20.0
"""Move the epoch when k x (now - epoch) exceeds this: e^20 keeps sums of e^k(t - epoch) well within a double."""


@dataclass(slots=True)
class Grows:
    """A number of GPU-hours that grows while jobs run: done + rate x (now - epoch) - rate_x_start, in seconds."""

    done: float = 0.0
    rate: float = 0.0
    rate_x_start: float = 0.0
    with_done: int = 0
    running: int = 0
    """How many records have done work, and how many run: the from-scratch sum lists a key only when some record
    contributes more than zero, and a residue of additions and subtractions must not make one appear."""

    def add(self, seconds: float, gpus: float, since: float | None, sign: int) -> None:
        if seconds / 3600 > 0:  # as the from-scratch sum sees it, in hours
            self.done += sign * seconds
            self.with_done += sign
        if since is not None:
            self.rate += sign * gpus
            self.rate_x_start += sign * gpus * since
            self.running += sign

    def hours(self, since_epoch: float) -> float:
        return max(0.0, self.done + self.rate * since_epoch - self.rate_x_start) / 3600

    def reported(self, since_epoch: float) -> bool:
        return self.with_done > 0 or (self.running > 0 and self.hours(since_epoch) > MIN_REPORTED_HOURS)


@dataclass(slots=True)
class Decayed:
    """A team's recent usage: running_gpus + e^-k(now - epoch) x (finished - running_start)."""

    running_gpus: float = 0.0
    running_start: float = 0.0
    finished: float = 0.0


@dataclass
class _Team:
    hours: Grows = field(default_factory=Grows)
    by_pool: dict[str, Grows] = field(default_factory=dict)
    by_priority: dict[str, Grows] = field(default_factory=dict)
    cost_done: float = 0.0
    cost_rate: float = 0.0
    cost_rate_x_start: float = 0.0
    recent: Decayed = field(default_factory=Decayed)
    period_start: float | None = None
    in_period: Grows = field(default_factory=Grows)
    in_period_cost: Grows = field(default_factory=Grows)
    jobs: set[str] = field(default_factory=set)
    """Its jobs not settled."""
    settled: int = 0
    """Its jobs settled (see the module's docstring): their records are gone, their contributions stay."""

    @property
    def has_jobs(self) -> bool:
        """Whether any record is the team's (the from-scratch sum lists only such teams)."""
        return bool(self.jobs) or self.settled > 0


class Accounting:
    """Per-team usage for one quota configuration and inventory; `apply` each record change, `teams(now)` to read."""

    def __init__(self, book: QuotaBook, node_pool: Mapping[str, str], now: float) -> None:
        self.book = book
        self.node_pool = dict(node_pool)
        self.epoch = now
        self.k = math.log(2) / book.config.usage_half_life_s
        self.budget_period = {t.name: t.budget.period for t in book.config.teams if t.budget}
        self.records: dict[str, JobRecord] = {}
        """The records of the jobs not settled (those that have not ended)."""
        self.settled_on_unknown: set[str] = set()
        """Nodes missing from `node_pool` that a settled job ran on (it was summed in no pool): when one appears,
        the sums are wrong until the records are read again."""
        self.counts = Tally()
        self._teams: dict[str, _Team] = {}
        self._starts: dict[str, tuple[float, float]] = {}
        """Budget period -> (a time, the start of the period it falls in): the last one `_roll` asked for."""

    @classmethod
    def build(
        cls, book: QuotaBook, node_pool: Mapping[str, str], records: Iterable[JobRecord], now: float
    ) -> "Accounting":
        acc = cls(book, node_pool, now)
        for r in records:
            acc.apply(r, now)
        return acc

    def apply(self, record: JobRecord, now: float) -> bool:
        """Take in a record's newer version (an older or equal one changes nothing). True when it changed."""
        known = self.records.get(record.id)
        if known is not None and known.version >= record.version:
            return False
        self._maybe_rebase(now)
        settles = record.state in TERMINAL_STATES and ended_at(record) <= now
        if settles:
            self._roll(record.spec.team, now)  # (its part of a period that began before `now` is counted in it)
        if known is not None:
            self._contribute(known, -1)
        self._contribute(record, +1)
        if settles:
            self.records.pop(record.id, None)
            s = self._teams[record.spec.team]
            s.jobs.discard(record.id)
            s.settled += 1
            if record.placement is not None and record.placement.gpus:
                node = record.placement.gpus[0].node
                if node not in self.node_pool:
                    self.settled_on_unknown.add(node)
        else:
            self.records[record.id] = record
        return True

    def with_nodes(self, node_pool: Mapping[str, str]) -> None:
        """Take in nodes new to the inventory (no node moved to another pool, none that a settled job ran on): only
        the jobs not settled may be on them."""
        for r in self.records.values():
            self._contribute(r, -1)
        self.node_pool = dict(node_pool)
        for r in self.records.values():
            self._contribute(r, +1)

    def teams(self, now: float, book: QuotaBook | None = None) -> dict[str, TeamUsage]:
        """Every team's usage at `now`; `book` brings current pool capacities (the configuration must be the same)."""
        return report(book or self.book, self.tally(now))

    def tally(self, now: float) -> Tally:
        self._maybe_rebase(now)
        for team in self.budget_period:
            self._roll(team, now)
        t = now - self.epoch
        decay = math.exp(-self.k * t)
        counts = {team: row for team, row in self.counts.counts.items() if self._teams[team].has_jobs}
        out = Tally(usage=self.counts.usage, demand=self.counts.demand, counts=counts)
        for team, s in self._teams.items():
            if not s.has_jobs:
                continue
            out.hours[team] = s.hours.hours(t)
            pools = {p: g.hours(t) for p, g in s.by_pool.items() if g.reported(t)}
            if pools:
                out.hours_by_pool[team] = pools
            prios = {p: g.hours(t) for p, g in s.by_priority.items() if g.reported(t)}
            if prios:
                out.hours_by_priority[team] = prios
            out.cost[team] = max(0.0, s.cost_done + s.cost_rate * t - s.cost_rate_x_start) / 3600
            if team in self.budget_period:
                out.in_period[team] = (s.in_period.hours(t), s.in_period_cost.hours(t))
            r = s.recent
            out.recent[team] = max(0.0, r.running_gpus + decay * (r.finished - r.running_start))
        return out

    # ---- one record's contribution ----------------------------------------------------------------------------

    def _contribute(self, r: JobRecord, sign: int) -> None:
        team = r.spec.team
        pool = pool_of(r, self.book, self.node_pool)
        count(self.counts, r, pool, sign)
        s = self._teams.get(team)
        if s is None:
            s = self._teams[team] = _Team()
            if team in self.budget_period:
                s.period_start = period_start(self.budget_period[team], self.epoch)
        if sign > 0:
            s.jobs.add(r.id)
        else:
            s.jobs.discard(r.id)
        gpus = float(r.spec.gpus)
        done = gpus * (r.run_s + r.lost_s)
        started = running_since(r)
        since = None if started is None else started - self.epoch
        price = price_of(self.book, pool)
        s.hours.add(done, gpus, since, sign)
        s.by_pool.setdefault(pool, Grows()).add(done, gpus, since, sign)
        s.by_priority.setdefault(r.spec.priority, Grows()).add(done, gpus, since, sign)
        s.cost_done += sign * done * price
        if since is not None:
            s.cost_rate += sign * gpus * price
            s.cost_rate_x_start += sign * gpus * price * since
        if s.period_start is not None:
            self._add_in_period(s, r, s.period_start, price, sign)
        self._decay(s.recent, r, gpus, sign)

    def _decay(self, d: Decayed, r: JobRecord, gpus: float, sign: int) -> None:
        """A record's recent usage as `report.recent_gpus` places it: a requeued job (no `started_at`) keeps the
        run time it had, decaying from its last change."""
        k, epoch = self.k, self.epoch
        start = _grown(k * (done_until(r) - r.run_s - r.lost_s - epoch))
        if running_since(r) is not None:
            d.running_gpus += sign * gpus
            d.running_start += sign * gpus * start
        elif r.run_s + r.lost_s > 0:
            d.finished += sign * gpus * (_grown(k * (ended_at(r) - epoch)) - start)

    def _add_in_period(self, s: _Team, r: JobRecord, start: float, price: float, sign: int) -> None:
        """A record's GPU time in the budget period from `start`, as `report.period_gpu_seconds` counts it: the
        finished part after `start` (a constant), and the current attempt from max(start, its start) on."""
        gpus = float(r.spec.gpus)
        done = gpus * done_after(r, start)
        started = running_since(r)
        since = None if started is None else max(start, started) - self.epoch
        s.in_period.add(done, gpus, since, sign)
        s.in_period_cost.add(done * price, gpus * price, since, sign)

    def _roll(self, team: str, now: float) -> None:
        """Start the team's new budget period if one began by `now` (and the team has a budget). Only forward: a
        period that settled jobs were counted in is never counted again without them."""
        period = self.budget_period.get(team)
        if period is None:
            return
        known = self._starts.get(period)
        if known is not None and known[0] == now:
            start = known[1]
        else:  # (`build` settles every ended job at one `now`: the calendar is asked once per period)
            start = period_start(period, now)
            self._starts[period] = (now, start)
        s = self._teams.get(team)
        if s is None:
            self._teams[team] = _Team(period_start=start)
        elif s.period_start is None or start > s.period_start:
            self._recount_period(team, s, start)

    def _recount_period(self, team: str, s: _Team, start: float) -> None:
        """A new period (day, week, month): what each record not settled has in it from scratch, since the part of
        a run before the new start no longer counts. A settled job has none: it ended before the period began."""
        s.period_start = start
        s.in_period, s.in_period_cost = Grows(), Grows()
        for job in s.jobs:
            r = self.records[job]
            self._add_in_period(s, r, start, price_of(self.book, pool_of(r, self.book, self.node_pool)), 1)

    def _maybe_rebase(self, now: float) -> None:
        """Move the epoch to `now` when the exponentials or the linear terms would grow too large."""
        shift = now - self.epoch
        if self.k * shift <= REBASE_EXPONENT:
            return
        factor = math.exp(-self.k * shift)
        self.epoch = now
        for s in self._teams.values():
            s.recent.running_start *= factor
            s.recent.finished *= factor
            for g in (s.hours, *s.by_pool.values(), *s.by_priority.values(), s.in_period, s.in_period_cost):
                g.rate_x_start -= g.rate * shift
            s.cost_rate_x_start -= s.cost_rate * shift


def _grown(exponent: float) -> float:
    """e^exponent, capped for times far in the future (bad clocks) so that one record cannot overflow the sums."""
    return math.exp(min(exponent, 2 * REBASE_EXPONENT))
