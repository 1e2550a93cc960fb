"""The incremental cohort totals agree with a from-scratch computation after any sequence of changes."""

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook, QuotaUsage, admit, admits

TEAMS = ["a", "b", "c", "d", "stranger"]
POOLS = ["p", "q"]


def four_teams(quotas: list[TeamQuota]) -> QuotaBook:
    """Teams a and b in cohort x, c and d in y, each with its quota (`pool` ignored) in both pools of 40 GPUs."""
    teams = [
        TeamConfig(name=name, org="o", cohort="x" if name in "ab" else "y",
                   quotas=[msgspec.structs.replace(quota, pool=p) for p in POOLS])
        for name, quota in zip("abcd", quotas, strict=True)
    ]  # fmt: skip
    config = QuotaConfig(pools=[PoolConfig(name=p, gpu_model="H100") for p in POOLS], orgs=[OrgConfig(name="o")],
                         teams=teams)  # fmt: skip
    return QuotaBook(config, {"p": 40, "q": 40})


def reference(book: QuotaBook, usage: dict[tuple[str, str], int], team: str, pool: str) -> int:
    idle: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for (t, p), used in usage.items():
        q = book.quota(t, p)
        if p == pool and used > q.nominal:
            borrowed[book.cohort_of(t)] = borrowed.get(book.cohort_of(t), 0) + used - q.nominal
    for (t, p), q in book.quotas.items():
        if p == pool:
            cap = q.nominal if q.lending_limit is None else q.lending_limit
            c = book.cohort_of(t)
            idle[c] = idle.get(c, 0) + max(0, min(cap, q.nominal - usage.get((t, p), 0)))
    cohort = book.cohort_of(team)
    spill = sum(max(0, b - idle.get(c, 0)) for c, b in borrowed.items() if c != cohort)
    return max(0, idle.get(cohort, 0) + book.unassigned(pool) - borrowed.get(cohort, 0) - spill)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.one_of(st.none(), st.integers(0, 8))), min_size=4, max_size=4),
    st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(POOLS), st.integers(-4, 8)), max_size=30),
)
def test_incremental_totals_match_a_full_recompute(
    quotas: list[tuple[int, int | None]], changes: list[tuple[str, str, int]]
) -> None:
    book = four_teams([TeamQuota(pool="", nominal=n, lending_limit=None if lend is None else min(lend, n))
                       for n, lend in quotas])  # fmt: skip
    totals = QuotaUsage(book)
    plain: dict[tuple[str, str], int] = {}
    for team, pool, change in changes:
        delta = max(change, -plain.get((team, pool), 0))
        plain[(team, pool)] = plain.get((team, pool), 0) + delta
        totals.add(team, pool, delta)
        for t in TEAMS:
            for p in POOLS:
                assert totals.borrowable(t, p) == reference(book, plain, t, p)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 8), st.one_of(st.none(), st.integers(0, 6))), min_size=4, max_size=4),
    st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(POOLS), st.integers(0, 12)), max_size=20),
    st.integers(1, 16),
    st.booleans(),
)
def test_the_quick_admission_answer_is_the_full_one(
    quotas: list[tuple[int, int | None]], usage: list[tuple[str, str, int]], gpus: int, preemptible: bool
) -> None:
    """`admits` (no reason written, the scheduler's hot path) answers as `admit` for every team and pool."""
    book = four_teams([TeamQuota(pool="", nominal=n, borrowing_limit=limit) for n, limit in quotas])
    totals = QuotaUsage(book)
    for team, pool, n in usage:
        totals.add(team, pool, n)
    for t in TEAMS:
        for p in POOLS:
            full = admit(book, totals, t, p, gpus, preemptible=preemptible)
            assert admits(book, totals, t, p, gpus, preemptible=preemptible) == (full.ok, full.borrowing)
