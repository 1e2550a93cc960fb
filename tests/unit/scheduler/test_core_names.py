"""The names the scheduling core keys its look-ups by: a GPU's slot as the contract spells it, and team and pool
names interned as they enter the core (so equal (team, pool) keys match by identity, not by content)."""

import sys

from hypothesis import given
from hypothesis import strategies as st

from chamber.common.contracts import GpuRef, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import QuotaBook
from chamber.scheduler.core.model import PendingJob, Shape, slot_of
from chamber.scheduler.core.queue import JobQueue


@given(st.text(min_size=1, max_size=40), st.integers(0, 1024))
def test_slot_of_is_the_contracts_slot(node: str, index: int) -> None:
    ref = GpuRef(node=node, index=index)
    assert slot_of(ref) == ref.slot


def _fresh(text: str) -> str:
    """An equal string that is not the interned one (as a decoded record's field is)."""
    return "".join(list(text))


def test_a_queued_jobs_team_is_interned() -> None:
    queue = JobQueue()
    canonical = sys.intern(_fresh("team-interned-test"))
    team = _fresh("team-interned-test")
    assert team is not canonical
    job = PendingJob(id="j1", team=team, priority=0, shape=Shape(1, 1), submitted_at=0.0, preemptions=0, attempt=0,
                     est_runtime_s=None)  # fmt: skip
    queue.push(job)
    assert queue.jobs["j1"].team is canonical


def test_a_quota_books_names_are_interned() -> None:
    config = QuotaConfig(
        pools=[PoolConfig(name=_fresh("pool-interned"), gpu_model="H100")], orgs=[OrgConfig(name="o")],
        teams=[TeamConfig(name=_fresh("team-book-interned"), org="o", cohort=_fresh("cohort-interned"),
                          quotas=[TeamQuota(pool=_fresh("pool-interned"), nominal=4)])],
    )  # fmt: skip
    book = QuotaBook(config)
    ((team, pool),) = book.quotas
    assert team is sys.intern(_fresh("team-book-interned"))
    assert pool is sys.intern(_fresh("pool-interned"))
    assert book.cohort_of(team) is sys.intern(_fresh("cohort-interned"))
    assert next(iter(book.capacity)) is pool
