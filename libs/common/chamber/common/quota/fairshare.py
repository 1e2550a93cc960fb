"""Fair shares by water-filling, the standing that orders the queue, and usage decay.

Per pool: every team first gets min(nominal, demand). The surplus is then poured into teams with unmet demand:
team t receives clamp(level * weight_t - recent_t, 0, extra_demand_t), with one level for all, found exactly by
sweeping the sorted breakpoints. `recent_t` (a team's decayed recent usage, in GPUs) lets a team that was idle
catch up and holds back one that has had more than its share lately.
"""

from collections.abc import Mapping

from chamber.common.quota.book import QuotaBook


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    return float(value * 0.5 ** (max(0.0, elapsed_s) / half_life_s))


def fair_shares(
    book: QuotaBook,
    demand: Mapping[tuple[str, str], int],
    recent: Mapping[str, float] | None = None,
) -> dict[tuple[str, str], float]:
    """(team, pool) -> fair share in GPUs, for every (team, pool) with demand or quota."""
    recent = recent or {}
    shares: dict[tuple[str, str], float] = {}
    by_pool: dict[str, list[tuple[str, int]]] = {}
    keys = set(demand) | set(book.quotas)
    for team, pool in keys:
        by_pool.setdefault(pool, []).append((team, demand.get((team, pool), 0)))
    for pool, rows in by_pool.items():
        capacity = book.capacity.get(pool, 0)
        extra: list[tuple[str, float, float, float]] = []  # team, weight, offset, cap
        given = 0.0
        for team, want in rows:
            q = book.quota(team, pool)
            base = min(q.nominal, want)
            shares[(team, pool)] = float(base)
            given += base
            more = want - base
            if q.borrowing_limit is not None:
                more = min(more, q.borrowing_limit + q.nominal - base)
            if more > 0:
                extra.append((team, book.weight(team), recent.get(team, 0.0), float(more)))
        surplus = max(0.0, capacity - given)
        if extra and surplus > 0:
            for team, add in _water_fill(extra, surplus).items():
                shares[(team, pool)] += add
    return shares


def _water_fill(rows: list[tuple[str, float, float, float]], amount: float) -> dict[str, float]:
    """Find the level L with sum(clamp(L*w - o, 0, c)) == amount (or everyone capped), exactly, in O(n log n).

    The total is piecewise linear in L: row (w, o, c) starts rising with slope w at L = o/w and stops at
    L = (o+c)/w. One sweep over the sorted breakpoints keeps the running total and slope, and stops in the
    segment where the total reaches `amount`; there the level follows by linear interpolation.
    """
    if sum(c for _, _, _, c in rows) <= amount:
        return {team: c for team, _, _, c in rows}
    events: list[tuple[float, float]] = []  # (level, change of slope)
    for _, w, o, c in rows:
        events.append((o / w, w))
        events.append(((o + c) / w, -w))
    events.sort()
    level = events[0][0]
    total = slope = 0.0
    for point, change in events:
        if point > level:
            reached = total + slope * (point - level)
            if reached >= amount:
                level += (amount - total) / slope
                break
            total, level = reached, point
        slope += change
    return {team: min(c, max(0.0, level * w - o)) for team, w, o, c in rows}


def standings(shares: Mapping[tuple[str, str], float], usage: Mapping[tuple[str, str], int]) -> dict[str, float]:
    """Per team: (fair share - usage) / max(1, fair share), over all pools. Higher goes first in the queue."""
    fair: dict[str, float] = {}
    used: dict[str, float] = {}
    for (team, _), s in shares.items():
        fair[team] = fair.get(team, 0.0) + s
    for (team, _), u in usage.items():
        used[team] = used.get(team, 0.0) + u
    return {team: (fair.get(team, 0.0) - used.get(team, 0.0)) / max(1.0, fair.get(team, 0.0)) for team in fair | used}
