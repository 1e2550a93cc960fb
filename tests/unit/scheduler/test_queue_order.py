"""The queue's lazy heaps against a plain model (hypothesis): whatever jobs are pushed, re-pushed, removed and
aged, a sub-queue's head is its first job in (aged first, rank, submit time) order, and the look-ahead after the
head yields each waiting job once, in that order."""

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.queue import AGED, JobQueue, smallest

SHAPE = Shape(per_replica=1, replicas=1)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 15), st.integers(0, 100), st.integers(0, 5)),
        st.tuples(st.just("remove"), st.integers(0, 15), st.just(0), st.just(0)),
        st.tuples(st.just("age"), st.just(0), st.integers(0, 200), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_heads_and_look_ahead_follow_aged_rank_submit_order(steps: list[tuple[str, int, int, int]]) -> None:
    ranks: dict[str, float] = {}
    queue = JobQueue(rank=lambda job: ranks[job.id])
    for op, n, t, r in steps:
        job_id = f"j{n}"
        if op == "push":
            ranks[job_id] = float(r)
            old = queue.jobs.get(job_id)
            submitted = old.submitted_at if old is not None else float(t)
            aged = old.aged if old is not None else False
            queue.push(PendingJob(job_id, "team", 0, SHAPE, submitted, 0, 0, None, aged=aged))
        elif op == "remove":
            queue.remove(job_id)
        else:
            queue.age(now=float(t), max_wait_s=50.0)
            assert all(job.aged for job in queue.jobs.values() if job.submitted_at <= t - 50.0)
    expected = sorted(queue.jobs.values(), key=lambda j: (AGED if j.aged else ranks[j.id], j.submitted_at, j.id))
    key = queue.key_of(expected[0]) if expected else None
    head = queue.head(key) if key is not None else None
    assert head is (expected[0] if expected else None)
    if key is not None:
        after = [j.id for j in queue.after_head(key, 100)]
        assert after == [j.id for j in expected[1:]]


@settings(max_examples=300, deadline=None)
@given(items=st.lists(st.integers(-50, 50)), k=st.integers(0, 12))
def test_smallest_of_a_heap_is_what_nsmallest_gives(items: list[int], k: int) -> None:
    heapq.heapify(items)
    assert smallest(items, k) == heapq.nsmallest(k, items)
