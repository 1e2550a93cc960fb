"""A quota configuration indexed for fast questions, and its validation."""

import math
from collections.abc import Mapping
from sys import intern

import msgspec

from chamber.common.contracts import QuotaConfig, TeamConfig, TeamQuota
from chamber.common.contracts.quota import BUDGET_RANGE, MAX_GPUS, MAX_PRICE
from chamber.common.priorities import DEFAULT_CLASSES

Usage = Mapping[tuple[str, str], int]
"""(team, pool) -> GPUs in use."""


class ConfigError(ValueError):
    """A quota configuration that must not be applied; the message says what is wrong and where."""


class QuotaBook:
    def __init__(self, config: QuotaConfig, capacity: Mapping[str, int] | None = None) -> None:
        self.config = config
        self._enabled = bool(config.teams)
        """Read ~3,000 times a cycle with a thousand teams; from the configuration it was a generic look-up each."""
        # Names interned: the scheduler looks (team, pool) keys up millions of times a contended minute, with the
        # names of its jobs (interned as they are queued); equal keys then compare by identity, not by content.
        self.teams: dict[str, TeamConfig] = {intern(t.name): t for t in config.teams}
        self.quotas: dict[tuple[str, str], TeamQuota] = {
            (intern(t.name), intern(q.pool)): q for t in config.teams for q in t.quotas
        }
        self.pools = {intern(p.name): p for p in config.pools}
        self.capacity: dict[str, int] = {intern(p.name): p.capacity or 0 for p in config.pools}
        self.capacity.update({intern(pool): n for pool, n in (capacity or {}).items()})
        self.cohorts: dict[str, list[str]] = {}
        for t in config.teams:
            self.cohorts.setdefault(t.cohort, []).append(t.name)
        self.nominal_total: dict[str, int] = {}
        self.team_pools: dict[str, list[str]] = {}
        """team -> the pools it has a quota in, in configuration order."""
        self._by_team: dict[str, dict[str, TeamQuota]] = {}
        """team -> pool -> its quota there: `quotas` by name, then by name (`quota`)."""
        for (team, pool), q in self.quotas.items():
            self.nominal_total[pool] = self.nominal_total.get(pool, 0) + q.nominal
            self.team_pools.setdefault(team, []).append(pool)
            self._by_team.setdefault(team, {})[pool] = q
        self.first_pool = min(self.capacity, default="")
        """The pool a job goes to when nothing else says which (its name sorts first)."""

    @property
    def enabled(self) -> bool:
        return self._enabled

    def quota(self, team: str, pool: str) -> TeamQuota:
        """A team without an entry for a pool has no guarantee there but may borrow. Looked up by team, then pool:
        the scheduler asks ~4,000 times a cycle with a thousand teams, and a (team, pool) key was a tuple to make,
        hash and compare each time (the names are interned, so each look-up by name matches by identity)."""
        pools = self._by_team.get(team)
        found = pools.get(pool) if pools is not None else None
        return found if found is not None else TeamQuota(pool=pool)

    def cohort_of(self, team: str) -> str:
        t = self.teams.get(team)
        return intern(t.cohort) if t else "default"

    def weight(self, team: str) -> float:
        t = self.teams.get(team)
        return t.weight if t else 1.0

    def unassigned(self, pool: str) -> int:
        return max(0, self.capacity.get(pool, 0) - self.nominal_total.get(pool, 0))

    def org_path(self, team: str) -> list[str]:
        """The team's organisations, innermost first."""
        parents = {o.name: o.parent for o in self.config.orgs}
        t = self.teams.get(team)
        path: list[str] = []
        org = t.org if t else None
        while org is not None and org not in path:
            path.append(org)
            org = parents.get(org)
        return path


MIN_WEIGHT = 1e-3
"""The least fair-share weight (the most is 1,000): with ratios of ~1e12 and beyond, water-filling's running sums
lost the smaller weights (1 + 1e-16 - 1 = 0), and a lighter team got a larger share, the shares more than the
capacity (found by review)."""
MIN_HALF_LIFE_S = 1.0
"""The shortest half-life of recent usage: a tiny one (1e-310 s) made the decay rate infinite."""


def validate(config: QuotaConfig, capacity: Mapping[str, int] | None = None) -> QuotaBook:
    """The book for `config`, or ConfigError naming every problem (the old configuration stays in force)."""
    problems = [f"{where}: {value} is not a finite number" for where, value in non_finite(config)]
    if config.usage_half_life_s < MIN_HALF_LIFE_S:
        problems.append(f"usage_half_life_s {config.usage_half_life_s:g} is below {MIN_HALF_LIFE_S:g} s")
    pools = [p.name for p in config.pools]
    _duplicates("pool", pools, problems)
    _duplicates("team", [t.name for t in config.teams], problems)
    _duplicates("organisation", [o.name for o in config.orgs], problems)
    orgs = {o.name: o.parent for o in config.orgs}
    for name, parent in orgs.items():
        if parent is not None and parent not in orgs:
            problems.append(f"organisation {name}: unknown parent {parent!r}")
        seen = [name]
        up = parent
        while up is not None and up in orgs:
            if up in seen:
                problems.append(f"organisation {name}: cycle {' -> '.join([*seen, up])}")
                break
            seen.append(up)
            up = orgs[up]
    for team in config.teams:
        if team.org not in orgs:
            problems.append(f"team {team.name}: unknown organisation {team.org!r}")
        if team.weight < MIN_WEIGHT:
            problems.append(f"team {team.name}: weight {team.weight:g} is below {MIN_WEIGHT:g}")
        for name in team.priorities:
            if name not in DEFAULT_CLASSES:
                problems.append(
                    f"team {team.name}: unknown priority class {name!r}; classes: {', '.join(DEFAULT_CLASSES)}"
                )
        _duplicates(f"team {team.name}: pool", [q.pool for q in team.quotas], problems)
        for q in team.quotas:
            if q.pool not in pools:
                problems.append(f"team {team.name}: unknown pool {q.pool!r}")
            if q.lending_limit is not None and q.lending_limit > q.nominal:
                problems.append(
                    f"team {team.name}, pool {q.pool}: lending_limit {q.lending_limit} > nominal {q.nominal}"
                )
        if team.budget is not None and team.budget.gpu_hours is None and team.budget.money is None:
            problems.append(f"team {team.name}: a budget needs gpu_hours or money")
        if team.budget is not None:
            low, high = BUDGET_RANGE
            for what, amount in (("gpu_hours", team.budget.gpu_hours), ("money", team.budget.money)):
                if amount is not None and not low <= amount <= high:
                    problems.append(f"team {team.name}: budget {what} {amount:g} is outside [{low:g}, {high:g}]")
    for pool_config in config.pools:
        if pool_config.cost_per_gpu_hour > MAX_PRICE:
            problems.append(f"pool {pool_config.name}: cost_per_gpu_hour {pool_config.cost_per_gpu_hour:g} is above "
                            f"{MAX_PRICE:g}")  # fmt: skip
    book = QuotaBook(config, capacity)
    for pool in pools:
        cap = book.capacity.get(pool, 0)
        total = book.nominal_total.get(pool, 0)
        if cap and total > cap:
            problems.append(f"pool {pool}: guarantees add up to {total} GPUs, above its capacity of {cap}")
        elif total > MAX_GPUS:
            problems.append(f"pool {pool}: guarantees add up to {total} GPUs, above the {MAX_GPUS} a pool may hold")
    problems.extend(_team_totals(book))
    if problems:
        raise ConfigError("; ".join(problems))
    return book


def _team_totals(book: QuotaBook) -> list[str]:
    """A team's guarantees over all its pools stay within MAX_GPUS: its published `nominal` is their sum (an
    int32 in the gRPC API), and a pool whose capacity is not known yet cannot bound them."""
    totals: dict[str, int] = {}
    for (team, _), q in book.quotas.items():
        totals[team] = totals.get(team, 0) + q.nominal
    return [f"team {team}: guarantees add up to {total} GPUs over its pools, above the {MAX_GPUS} a team may have"
            for team, total in totals.items() if total > MAX_GPUS]  # fmt: skip


def _duplicates(what: str, names: list[str], problems: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            problems.append(f"{what} {name!r} declared twice")
        seen.add(name)


def non_finite(value: object, where: str = "") -> list[tuple[str, float]]:
    """Every float field holding inf or nan, as (where, value): `pools[h100].cost_per_gpu_hour`.

    YAML reads `.inf` and `.nan`, and the range checks of the contracts let inf through where there is no upper
    bound; but JSON has no such numbers, so the stored configuration would hold null there and could never be
    decoded again. Walks every field, so a float field added later is covered too."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(where or "$", value)]
    if isinstance(value, msgspec.Struct):
        return [bad for name in value.__struct_fields__
                for bad in non_finite(getattr(value, name), f"{where}.{name}" if where else name)]  # fmt: skip
    if isinstance(value, list | tuple):
        return [bad for i, item in enumerate(value) for bad in non_finite(item, f"{where}[{getattr(item, 'name', i)}]")]
    return []
