"""The queue's lazy heaps against a plain model (hypothesis): whatever jobs are pushed, re-pushed, removed and
aged, a sub-queue's head is its first job in (aged first, rank, submit time) order, and the look-ahead after the
head yields each waiting job once, in that order."""

import heapq

from hypothesis import example, given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.queue import AGED, JobQueue, order_key, smallest

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


group_ops = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "remove", "park", "park", "wake", "age"]),
        st.integers(0, 7),
        st.integers(1, 3),
        st.integers(0, 200),
    ),
    min_size=5,
    max_size=60,
)


@settings(max_examples=2000, deadline=None)
@given(group_ops)
@example([("push", 1, 1, 100), ("push", 3, 2, 150), ("park", 1, 1, 0), ("park", 3, 1, 0), ("push", 4, 2, 10)])
@example([("push", 5, 1, 100), ("park", 5, 1, 0), ("push", 6, 2, 50), ("push", 7, 2, 150), ("park", 7, 1, 0)])
def test_a_parked_groups_first_order_is_what_computing_it_afresh_gives(steps: list[tuple[str, int, int, int]]) -> None:
    """`first_order` is kept between parks, wakes and jobs coming and going where that cannot change it; whatever
    happens, it is the least order among the group's heads, as computed from scratch."""
    queue = JobQueue()
    standing: dict[str, float] = {}
    group = ("team", "default", True, 0)
    for op, n, gpus, t in steps:
        job_id = f"j{n}"
        if op == "push" and job_id not in queue.jobs:
            queue.push(PendingJob(job_id, "team", 0, Shape(gpus, 1), float(t), 0, 0, None, preemptible=True))
        elif op == "remove":
            queue.remove(job_id)
        elif op == "park" and job_id in queue.jobs:
            sq = queue._where[job_id]
            head = queue.head_of(sq)
            if head is not None:  # a head, or (as the reservation look-ahead may) a job behind it
                job = queue.jobs[job_id]
                queue.park(job, group, queue.order_of(job, standing))
        elif op == "wake":
            queue.wake(group, gpus)
        else:
            queue.age(now=float(t), max_wait_s=100.0)
        parking = queue.parked.get(group)
        kept = queue.first_order(group, standing)  # kept for the next step, where it is still current
        if parking is None:
            assert kept is None
            continue
        heads = [h for _, _, sq in parking.subqueues if (h := queue.head_of(sq)) is not None]
        assert kept == min((queue.order_of(h, standing) for h in heads), default=None)


def test_a_reserved_job_that_becomes_its_sub_queues_head_can_be_the_groups_first() -> None:
    """Within a sub-queue jobs follow (rank, submit time), but the queue order puts a reserved job ahead: when the
    head before it leaves, the group's first order can go down though the first head's sub-queue did not change
    (found by review)."""
    queue = JobQueue()
    standing: dict[str, float] = {}
    group = ("team", "default", True, 0)
    queue.reserved = {"b2": ()}  # b2 holds a reservation (sticky), though b1 is ahead of it in its sub-queue
    for job_id, gpus, t in (("a1", 1, 10.0), ("b1", 2, 50.0), ("b2", 2, 60.0)):
        queue.push(PendingJob(job_id, "team", 0, Shape(gpus, 1), t, 0, 0, None, preemptible=True))
    for job_id in ("a1", "b1"):
        queue.park(queue.jobs[job_id], group, queue.order_of(queue.jobs[job_id], standing))
    assert queue.first_order(group, standing) == queue.order_of(queue.jobs["a1"], standing)
    queue.remove("b1")
    assert queue.first_order(group, standing) == queue.order_of(queue.jobs["b2"], standing)


job_fields = st.tuples(
    st.integers(-(10**6), 10**6),  # priority
    st.booleans(),  # aged
    st.booleans(),  # reserved
    st.integers(0, 8),  # preemptions
    st.sampled_from([0.0, 0.5, 2.0]),  # fair-share standing
    st.sampled_from([0.0, 1.0, 5.0]),  # rank
    st.sampled_from([0.0, 10.0]),  # submitted at
    st.sampled_from(["a", "b"]),  # id
)


@settings(max_examples=500, deadline=None)
@given(job_fields, job_fields, st.integers(0, 5))
def test_the_packed_queue_order_orders_as_its_parts_would(
    one: tuple[int, bool, bool, int, float, float, float, str],
    two: tuple[int, bool, bool, int, float, float, float, str],
    cap: int,
) -> None:
    """`order_key` packs (-priority, not aged, not reserved, -preemption standing) into one integer: two jobs
    order by it exactly as by those parts and then the rest, one element at a time."""

    def both(fields: tuple[int, bool, bool, int, float, float, float, str]) -> tuple[tuple[object, ...], object]:
        priority, aged, reserved, preemptions, standing, rank, submitted, job_id = fields
        job = PendingJob(id=job_id, team="t", priority=priority, shape=SHAPE, submitted_at=submitted,
                         preemptions=preemptions, attempt=0, est_runtime_s=None, aged=aged)  # fmt: skip
        parts = (-priority, not aged, not reserved, -min(preemptions, cap), -standing, AGED if aged else rank,
                 submitted, job_id)  # fmt: skip
        return parts, order_key(job, {"t": standing}, cap, rank, reserved)

    parts_one, packed_one = both(one)
    parts_two, packed_two = both(two)
    assert (packed_one < packed_two) == (parts_one < parts_two)  # type: ignore[operator]
    assert (packed_one == packed_two) == (parts_one == parts_two)
