"""May a team start `gpus` more in a pool? Which running jobs run on borrowed capacity? Who may reclaim?"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from chamber.common.contracts import TeamQuota
from chamber.common.quota.book import QuotaBook, Usage


@dataclass(frozen=True, slots=True)
class Admission:
    ok: bool
    borrowing: bool
    reason: str


class QuotaUsage:
    """GPUs in use per (team, pool), with the cohort totals admission needs kept up to date: O(1) per check.

    Per (pool, cohort): `idle` = idle lendable nominal of its teams, `borrowed` = their usage above nominal.
    Per pool: `excess` = the sum over cohorts of borrowing beyond their own lenders (drawn from unassigned
    capacity), which other cohorts cannot use.
    """

    def __init__(self, book: QuotaBook, usage: Usage | None = None) -> None:
        self.book = book
        self.used: dict[tuple[str, str], int] = {}
        self._used_in: dict[str, dict[str, int]] = {}
        """team -> pool -> GPUs in use: `used` by name, then by name (`used_in`, see `QuotaBook.quota`)."""
        self.idle: dict[tuple[str, str], int] = {}
        self.borrowed: dict[tuple[str, str], int] = {}
        self.excess: dict[str, int] = {}
        self._of: dict[str, dict[str, tuple[tuple[str, str], TeamQuota]]] = {}
        """team -> pool -> its (pool, cohort) and quota: the book does not change under a `QuotaUsage`, and the
        scheduler asks `borrowable` a million times a contended minute."""
        self._unassigned: dict[str, int] = {}
        self.changes = 0
        """Counts the changes of usage: what anyone may borrow is as it was while this stays."""
        self.pool_changes: dict[str, int] = {}
        """The same per pool: what anyone may borrow in a pool is as it was while its count stays."""
        for team, pool in book.quotas:
            self._contribute(team, pool, 0, +1)
        for (team, pool), n in (usage or {}).items():
            self.add(team, pool, n)

    def get(self, key: tuple[str, str], default: int = 0) -> int:
        return self.used.get(key, default)

    def used_in(self, team: str, pool: str) -> int:
        """GPUs `team` uses in `pool` (`get((team, pool))`, without making, hashing and comparing a key tuple)."""
        pools = self._used_in.get(team)
        return pools.get(pool, 0) if pools is not None else 0

    def items(self) -> "Iterable[tuple[tuple[str, str], int]]":
        return self.used.items()

    def values(self) -> "Iterable[int]":
        return self.used.values()

    def __getitem__(self, key: tuple[str, str]) -> int:
        return self.used.get(key, 0)

    def __iter__(self) -> "Iterator[tuple[str, str]]":
        return iter(self.used)

    def __len__(self) -> int:
        return len(self.used)

    def cohort_of(self, team: str, pool: str) -> tuple[str, str]:
        """(pool, cohort): where `team` borrows in `pool`."""
        return self._cohort_and_quota(team, pool)[0]

    def _cohort_and_quota(self, team: str, pool: str) -> tuple[tuple[str, str], TeamQuota]:
        pools = self._of.get(team)
        if pools is None:
            pools = self._of[team] = {}
        found = pools.get(pool)
        if found is None:
            found = pools[pool] = ((pool, self.book.cohort_of(team)), self.book.quota(team, pool))
        return found

    def _contribute(self, team: str, pool: str, used: int, sign: int) -> None:
        cohort, q = self._cohort_and_quota(team, pool)
        before = self._excess(cohort)
        self.idle[cohort] = self.idle.get(cohort, 0) + sign * lendable(q, used)
        self.borrowed[cohort] = self.borrowed.get(cohort, 0) + sign * max(0, used - q.nominal)
        self.excess[pool] = self.excess.get(pool, 0) + self._excess(cohort) - before

    def _excess(self, cohort: tuple[str, str]) -> int:
        return max(0, self.borrowed.get(cohort, 0) - self.idle.get(cohort, 0))

    def add(self, team: str, pool: str, delta: int) -> None:
        """`_contribute` with the old usage taken out and the new put in, in one pass over the cohort's totals
        (the scheduler calls this for every placement and every end; two passes were twice the look-ups)."""
        if not delta:
            return
        key = (team, pool)
        used = self.used.get(key, 0)
        after = used + delta
        self.changes += 1
        self.pool_changes[pool] = self.pool_changes.get(pool, 0) + 1
        cohort, q = self._cohort_and_quota(team, pool)
        idle, borrowed = self.idle.get(cohort, 0), self.borrowed.get(cohort, 0)
        before = max(0, borrowed - idle)
        idle += lendable(q, after) - lendable(q, used)
        borrowed += max(0, after - q.nominal) - max(0, used - q.nominal)
        self.idle[cohort], self.borrowed[cohort] = idle, borrowed
        self.excess[pool] = self.excess.get(pool, 0) + max(0, borrowed - idle) - before
        self.used[key] = after
        pools = self._used_in.get(team)
        if pools is None:
            pools = self._used_in[team] = {}
        pools[pool] = after

    def borrowable(self, team: str, pool: str) -> int:
        """GPUs `team` could borrow in `pool` now: what the rest of its cohort lends (idle nominal up to each
        lending limit) plus the pool's unassigned capacity, minus what borrowers already hold of them (other
        cohorts first draw on their own lenders, the rest on the unassigned capacity).

        The team's own idle nominal is not in it: a job's first GPUs fill that idle part (they are not borrowed),
        so counting it again here would lend the team its own guarantee a second time, taking the GPUs from
        another cohort's guarantee or from a cohort-mate beyond its lending limit."""
        of = self._of.get(team)  # (`_cohort_and_quota`, `used_in` and `lendable` inlined: asked ~4,000 times a cycle)
        found = of.get(pool) if of is not None else None
        cohort, q = found if found is not None else self._cohort_and_quota(team, pool)
        idle, borrowed = self.idle.get(cohort, 0), self.borrowed.get(cohort, 0)
        spill = self.excess.get(pool, 0) - (borrowed - idle if borrowed > idle else 0)  # other cohorts' past lenders
        unassigned = self._unassigned.get(pool)
        if unassigned is None:
            unassigned = self._unassigned[pool] = self.book.unassigned(pool)
        # `lendable`: its own idle nominal, up to its lending limit
        pools = self._used_in.get(team)
        own = q.nominal - (pools.get(pool, 0) if pools is not None else 0)
        own = max(0, min(q.nominal if q.lending_limit is None else q.lending_limit, own))
        room = idle - own + unassigned - borrowed - spill
        return room if room > 0 else 0


def lendable(quota: TeamQuota, used: int) -> int:
    """The part of a team's idle nominal it lends to its cohort: all of it, or at most its lending limit."""
    cap = quota.nominal if quota.lending_limit is None else quota.lending_limit
    return max(0, min(cap, quota.nominal - used))


def borrowable(book: QuotaBook, usage: "Usage | QuotaUsage", team: str, pool: str) -> int:
    totals = usage if isinstance(usage, QuotaUsage) else QuotaUsage(book, usage)
    return totals.borrowable(team, pool)


def admits(
    book: QuotaBook, usage: QuotaUsage, team: str, pool: str, gpus: int, *, preemptible: bool
) -> tuple[bool, bool]:
    """(ok, borrowing) exactly as `admit` decides, without writing its reason: the scheduler asks this for
    thousands of queue heads per cycle and needs only the answer."""
    if not book.enabled:
        return True, False
    q = book.quota(team, pool)
    used = usage.used_in(team, pool)
    after = used + gpus
    if after <= q.nominal:
        return True, False
    if not preemptible:
        return False, False
    if q.borrowing_limit is not None and after - q.nominal > q.borrowing_limit:
        return False, True
    return after - max(used, q.nominal) <= usage.borrowable(team, pool), True


def admit(
    book: QuotaBook, usage: "Usage | QuotaUsage", team: str, pool: str, gpus: int, *, preemptible: bool
) -> Admission:
    if not book.enabled:
        return Admission(True, False, "")
    q = book.quota(team, pool)
    used = usage.get((team, pool), 0)
    after = used + gpus
    if after <= q.nominal:
        return Admission(True, False, f"within nominal quota ({after} of {q.nominal} in {pool})")
    if not preemptible:
        return Admission(
            False, False, f"over nominal quota in {pool} ({used} + {gpus} > {q.nominal}); only preemptible jobs borrow"
        )
    over = after - q.nominal
    if q.borrowing_limit is not None and over > q.borrowing_limit:
        return Admission(
            False, True, f"borrowing limit: {over} GPUs above nominal in {pool}, limit {q.borrowing_limit}"
        )
    need = after - max(used, q.nominal)
    can = borrowable(book, usage, team, pool)
    if need > can:
        return Admission(
            False, True, f"cohort and unassigned capacity have {can} GPUs to lend in {pool}, {need} needed"
        )
    return Admission(True, True, f"borrowing {over} GPUs above nominal in {pool}")


def may_reclaim(book: QuotaBook, usage: "Usage | QuotaUsage", team: str, pool: str, gpus: int) -> bool:
    """A team asking for no more than its nominal may take back borrowed capacity."""
    return book.enabled and usage.get((team, pool), 0) + gpus <= book.quota(team, pool).nominal


def borrowed_jobs(book: QuotaBook, running: Iterable[tuple[str, str, str, int, int, float]]) -> set[str]:
    """Jobs on borrowed capacity, from (job, team, pool, gpus, priority, started_at): per team and pool, jobs
    fill the nominal in order of priority (highest first) then start time; the ones beyond it are borrowing."""
    if not book.enabled:
        return set()
    groups: dict[tuple[str, str], list[tuple[int, float, str, int]]] = {}
    for job, team, pool, gpus, priority, started in running:
        groups.setdefault((team, pool), []).append((-priority, started, job, gpus))
    out: set[str] = set()
    for (team, pool), jobs in groups.items():
        nominal = book.quota(team, pool).nominal
        total = 0
        for _, _, job, gpus in sorted(jobs):
            total += gpus
            if total > nominal:
                out.add(job)
    return out
