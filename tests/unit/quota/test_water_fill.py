"""The O(n log n) water-filling gives the same shares as the original quadratic sweep, on random inputs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.quota.fairshare import _water_fill

Row = tuple[str, float, float, float]


def quadratic_water_fill(rows: list[Row], amount: float) -> dict[str, float]:
    """The original implementation (total recomputed at every breakpoint): the reference."""
    if sum(c for _, _, _, c in rows) <= amount:
        return {team: c for team, _, _, c in rows}
    points = sorted({o / w for _, w, o, _ in rows} | {(o + c) / w for _, w, o, c in rows})

    def total_at(level: float) -> float:
        return sum(min(c, max(0.0, level * w - o)) for _, w, o, c in rows)

    lo = points[0]
    for p in points:
        if total_at(p) >= amount:
            hi = p
            break
        lo = p
    else:
        hi = points[-1]
    t_lo, t_hi = total_at(lo), total_at(hi)
    level = hi if t_hi == t_lo else lo + (amount - t_lo) * (hi - lo) / (t_hi - t_lo)
    return {team: min(c, max(0.0, level * w - o)) for team, w, o, c in rows}


row = st.tuples(
    st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.5]),  # weight
    st.one_of(st.just(0.0), st.floats(0, 500, allow_nan=False)),  # recent usage
    st.integers(1, 400).map(float),  # extra demand
)


@settings(max_examples=500, deadline=None)
@given(rows=st.lists(row, min_size=1, max_size=40), amount=st.floats(0.5, 5000, allow_nan=False))
def test_fast_water_fill_equals_the_quadratic_one(rows: list[tuple[float, float, float]], amount: float) -> None:
    named = [(f"t{i}", w, o, c) for i, (w, o, c) in enumerate(rows)]
    fast = _water_fill(named, amount)
    slow = quadratic_water_fill(named, amount)
    assert fast.keys() == slow.keys()
    for team in slow:
        assert fast[team] == pytest.approx(slow[team], rel=1e-9, abs=1e-7), team
    assert sum(fast.values()) == pytest.approx(min(amount, sum(c for *_, c in rows)), rel=1e-9, abs=1e-7)


def test_ties_and_identical_rows_share_equally() -> None:
    rows = [("a", 1.0, 0.0, 10.0), ("b", 1.0, 0.0, 10.0), ("c", 1.0, 0.0, 10.0)]
    assert _water_fill(rows, 9.0) == {"a": pytest.approx(3.0), "b": pytest.approx(3.0), "c": pytest.approx(3.0)}
