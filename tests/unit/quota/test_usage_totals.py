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
    q = book.quota(team, pool)
    own = max(0, min(q.nominal if q.lending_limit is None else q.lending_limit, q.nominal - usage.get((team, pool), 0)))
    lent_by_others = idle.get(cohort, 0) - own  # its own idle quota is what its next GPUs fill, not a loan
    return max(0, lent_by_others + book.unassigned(pool) - borrowed.get(cohort, 0) - spill)


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
                assert totals.used_in(t, p) == totals.get((t, p)) == plain.get((t, p), 0)


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


def beyond_quota(book: QuotaBook, usage: dict[tuple[str, str], int], pool: str) -> int:
    """GPUs borrowed in `pool` beyond what cohorts lend and the unassigned capacity: 0 unless quota is exceeded.

    From scratch: per cohort, usage above nominal minus the idle nominal its teams lend; what remains must come
    from the pool's unassigned capacity (other cohorts' guarantees are not lent)."""
    idle: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for team in {t for t, _ in usage} | set(book.teams):
        q, used = book.quota(team, pool), usage.get((team, pool), 0)
        cohort = book.cohort_of(team)
        cap = q.nominal if q.lending_limit is None else q.lending_limit
        idle[cohort] = idle.get(cohort, 0) + max(0, min(cap, q.nominal - used))
        borrowed[cohort] = borrowed.get(cohort, 0) + max(0, used - q.nominal)
    return max(0, sum(max(0, b - idle[c]) for c, b in borrowed.items()) - book.unassigned(pool))


def reclaim(book: QuotaBook, totals: QuotaUsage, plain: dict[tuple[str, str], int], pool: str) -> None:
    """What the scheduler does after admitting a job within its team's nominal: preempt borrowers (one GPU at a
    time, from a cohort that borrows beyond its lenders) until the pool is within quota again."""
    while beyond_quota(book, plain, pool):
        team = next(t for (t, p), used in sorted(plain.items())
                    if p == pool and used > book.quota(t, p).nominal and totals.borrowed[(p, book.cohort_of(t))]
                    > totals.idle[(p, book.cohort_of(t))])  # fmt: skip
        plain[(team, pool)] -= 1
        totals.add(team, pool, -1)


REQUESTS = st.tuples(st.sampled_from(TEAMS), st.sampled_from(POOLS), st.integers(-8, 16), st.booleans())
"""(team, pool, GPUs asked, preemptible); GPUs <= 0: that many released."""


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(0, 12))), min_size=4, max_size=4),
    st.lists(REQUESTS, max_size=40),
)
def test_admitted_borrowing_never_exceeds_quota(
    quotas: list[tuple[int, int | None]], requests: list[tuple[str, str, int, bool]]
) -> None:
    """Start from an idle fleet; admit jobs (negative: some GPUs released) only when `admits` says yes. After
    every borrowing admission, each pool's borrowing beyond the cohorts' lenders fits in its unassigned capacity:
    no cohort's guarantee is lent to another, no team lends beyond its lending limit."""
    book = four_teams([TeamQuota(pool="", nominal=n, lending_limit=None if lend is None else min(lend, n))
                       for n, lend in quotas])  # fmt: skip
    totals = QuotaUsage(book)
    plain: dict[tuple[str, str], int] = {}
    for team, pool, gpus, preemptible in requests:
        if gpus <= 0:
            release = min(-gpus, plain.get((team, pool), 0))
            plain[(team, pool)] = plain.get((team, pool), 0) - release
            totals.add(team, pool, -release)
        else:
            ok, borrowing = admits(book, totals, team, pool, gpus, preemptible=preemptible)
            if not ok:
                continue
            plain[(team, pool)] = plain.get((team, pool), 0) + gpus
            totals.add(team, pool, gpus)
            if not borrowing:
                reclaim(book, totals, plain, pool)
        for p in POOLS:
            assert beyond_quota(book, plain, p) == 0, (p, plain)
