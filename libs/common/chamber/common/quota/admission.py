"""May a team start `gpus` more in a pool? Which running jobs run on borrowed capacity? Who may reclaim?"""

from collections.abc import Iterable
from dataclasses import dataclass

from chamber.common.quota.book import QuotaBook, Usage


@dataclass(frozen=True, slots=True)
class Admission:
    ok: bool
    borrowing: bool
    reason: str


def borrowable(book: QuotaBook, usage: Usage, team: str, pool: str) -> int:
    """GPUs `team` could borrow in `pool` now: its cohort's idle lendable quota plus the pool's unassigned
    capacity, minus what borrowers already hold of them (other cohorts first draw on their own lenders)."""
    cohort = book.cohort_of(team)
    idle: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for (t, p), used in usage.items():
        if p != pool:
            continue
        q = book.quota(t, p)
        c = book.cohort_of(t)
        if used > q.nominal:
            borrowed[c] = borrowed.get(c, 0) + used - q.nominal
    for (t, p), q in book.quotas.items():
        if p != pool:
            continue
        used = usage.get((t, p), 0)
        cap = q.nominal if q.lending_limit is None else q.lending_limit
        c = book.cohort_of(t)
        idle[c] = idle.get(c, 0) + max(0, min(cap, q.nominal - used))
    spill = sum(max(0, b - idle.get(c, 0)) for c, b in borrowed.items() if c != cohort)
    return max(0, idle.get(cohort, 0) + book.unassigned(pool) - borrowed.get(cohort, 0) - spill)


def admit(book: QuotaBook, usage: Usage, team: str, pool: str, gpus: int, *, preemptible: bool) -> Admission:
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
        return Admission(False, True, f"cohort has {can} idle GPUs to lend in {pool}, {need} needed")
    return Admission(True, True, f"borrowing {over} GPUs above nominal in {pool}")


def may_reclaim(book: QuotaBook, usage: Usage, team: str, pool: str, gpus: int) -> bool:
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
