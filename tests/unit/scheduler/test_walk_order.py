"""The walk order the queue keeps from cycle to cycle against one built from scratch (hypothesis): whatever jobs
are pushed, removed, aged, parked and woken, and however standings and reservations change, a cycle's walk
(`JobQueue.heads` read through `Walk`, with items pushed on the way) gives the sub-queues and parked groups in
the order one heap of them all gives, ties included: the kept order can never go stale."""

import copy
import heapq
import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.model import PendingJob, Shape
from chamber.scheduler.core.queue import WOKEN, Entry, JobQueue, ParkGroup, Parking, SubQueue, Walk, entry
from tests.support.core import pure_core_only

TEAMS = ["a", "b", "c"]
SHAPES = [Shape(1, 1), Shape(2, 1), Shape(8, 2)]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 11), st.integers(0, 20), st.integers(0, 3)),
        st.tuples(st.just("remove"), st.integers(0, 11), st.just(0), st.just(0)),
        st.tuples(st.just("age"), st.just(0), st.integers(0, 60), st.just(0)),
        st.tuples(st.just("park"), st.integers(0, 11), st.just(0), st.just(0)),
        st.tuples(st.just("wake"), st.integers(0, 11), st.integers(0, 20), st.integers(0, 1)),
        st.tuples(st.just("standing"), st.integers(0, 2), st.integers(-2, 2), st.just(0)),
        st.tuples(st.just("reserve"), st.integers(0, 11), st.just(0), st.just(0)),
        st.tuples(st.just("cycle"), st.integers(0, 11), st.integers(0, 1000), st.just(0)),
    ),
    min_size=10,
    max_size=80,
)


def _group(job: PendingJob) -> ParkGroup:
    return (job.team, "pool", job.preemptible, job.priority)


def _heap(queue: JobQueue, standing: dict[str, float], seq: "itertools.count[int]") -> list[Entry]:
    """The heap a cycle built before the order was kept: every sub-queue not parked (in the order they were made),
    then every parked group, numbered in that order as the tie-break."""
    heap: list[Entry] = []
    for sq in list(queue._subqueues.values()):
        if sq.parked is None:
            head = queue.head_of(sq)
            if head is not None:
                heap.append(entry(queue.order_of(head, standing), 0, next(seq), sq))
    for group, parking in queue.parked.items():
        heap.append(entry(parking.order, 0, next(seq), group))
    heapq.heapify(heap)
    return heap


def _walk(queue: JobQueue, standing: dict[str, float], seed: int, *, kept: bool) -> list[object]:
    """Read a cycle's walk as a cycle does, taking the head of some sub-queues (they come back with their next
    head) and waking parked groups (all, or their small heads; their sub-queues come in after), through the kept
    order or through one heap built from scratch. Returns the keys of what it met, in order."""
    seq = itertools.count()
    if kept:
        walk = Walk(queue, queue.heads(standing))
        pop, push = walk.pop, walk.push
    else:
        heap = _heap(queue, standing, seq)

        def pop() -> Entry | None:
            return heapq.heappop(heap) if heap else None

        def push(item: Entry) -> None:
            heapq.heappush(heap, item)

    met: list[object] = []
    while (popped := pop()) is not None and len(met) < 200:
        kind, number, item = popped[-3:]
        if isinstance(item, Parking):
            item = item.group  # a parked group's item in the kept order holds its parking (see `queue.Entry`)
        step = seed + len(met)
        if not isinstance(item, SubQueue):
            met.append(item)
            for sq in queue.wake(item, None if step % 2 else 2):
                head = queue.head_of(sq)
                if head is not None:
                    push(entry(queue.order_of(head, standing), WOKEN if kept else 0, next(seq), sq))
            continue
        met.append(item.key)
        head = queue.head_of(item)
        if head is not None and step % 3 == 0:
            queue.remove(head.id)
            nxt = queue.head_of(item)
            if nxt is not None:
                push(entry(queue.order_of(nxt, standing), kind, number, item))
    return met


@pure_core_only
@settings(max_examples=300, deadline=None)
@given(ops)
@example([("push", 0, 0, 0), ("push", 6, 5, 0), ("park", 0, 0, 0), ("park", 1, 0, 0), ("wake", 0, 2, 1)]).via(
    "a parked group's order ties with the head of its sub-queue woken alone: the sub-queue comes first"
)
def test_the_kept_walk_order_is_the_order_of_a_heap_built_from_scratch(steps: list[tuple[str, int, int, int]]) -> None:
    queue = JobQueue()
    standing: dict[str, float] = {}
    for op, n, t, r in steps:
        if op == "cycle":  # the queue goes on from what the kept walk did (heads taken, groups woken)
            twin = copy.deepcopy(queue)
            assert _walk(queue, standing, t, kept=True) == _walk(twin, standing, t, kept=False)
        else:
            standing = _change(queue, standing, (op, n, t, r))
    twin = copy.deepcopy(queue)
    assert _walk(queue, standing, 1, kept=True) == _walk(twin, standing, 1, kept=False)


def _change(queue: JobQueue, standing: dict[str, float], step: tuple[str, int, int, int]) -> dict[str, float]:
    """One step of `ops` other than a cycle; returns the standings after it (a change makes a new mapping)."""
    op, n, t, r = step
    job_id = f"j{n}"
    job = queue.jobs.get(job_id)
    if op == "push":
        queue.push(
            PendingJob(job_id, TEAMS[n % 3], 10 * (r % 2), SHAPES[n // 3 % 3], float(t), r, 0, None,
                       preemptible=n % 2 == 0)
        )  # fmt: skip
    elif op == "remove":
        queue.remove(job_id)
    elif op == "age":
        queue.age(now=float(t), max_wait_s=30.0)
    elif op == "park" and queue.jobs:
        job = queue.jobs[sorted(queue.jobs)[n % len(queue.jobs)]]
        queue.park(job, _group(job), queue.order_of(job, standing))
    elif op == "wake" and queue.parked:
        group = sorted(queue.parked)[n % len(queue.parked)]
        queue.wake(group, t if r else None)
    elif op == "standing":
        standing = {**standing, TEAMS[n]: float(t)}
    elif op == "reserve":
        queue.reserved = {job_id: ()} if job is not None else {}
    return standing


@settings(max_examples=300, deadline=None)
@given(ops)
def test_what_the_queue_keeps_for_a_cycle_is_never_stale(steps: list[tuple[str, int, int, int]]) -> None:
    """After every step (cycles included), each parked group's first order (cached between its changes) is the
    least order of its sub-queues' heads, its smallest head's GPUs (kept as it changes) are its smallest
    sub-queue's, and each team's smallest waiting job (counted on push and remove) is the smallest of its jobs in
    the queue, all found from scratch."""
    queue = JobQueue()
    standing: dict[str, float] = {}
    for op, n, t, r in steps:
        if op == "cycle":
            _walk(queue, standing, t, kept=True)
        else:
            standing = _change(queue, standing, (op, n, t, r))
        for group, parking in queue.parked.items():
            assert parking.min_gpus == parking.subqueues[0][0]  # kept as sub-queues are parked into it and woken
            heads = [
                head for sq in list(queue._subqueues.values()) if sq.parked == group and (head := queue.head_of(sq))
            ]
            expected = min((queue.order_of(head, standing) for head in heads), default=None)
            assert queue.first_order(group, standing) == expected
        smallest: dict[str, int] = {}
        for job in queue.jobs.values():
            smallest[job.team] = min(job.shape.gpus, smallest.get(job.team, job.shape.gpus))
        assert queue.smallest_by_team() == smallest


class _AllCurrent:
    """A queue whose kept items are all current (what `Walk` asks of its queue)."""

    def current(self, item: Entry) -> bool:
        return True


@pure_core_only
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 50), max_size=20),
    st.lists(st.integers(0, 50), max_size=20),
    st.dictionaries(st.sampled_from("abc"), st.lists(st.integers(0, 50), max_size=10), max_size=3),
    st.lists(st.tuples(st.integers(0, 50), st.sampled_from("abc") | st.none()), max_size=20),
)
def test_lanes_are_merged_in_order_and_a_closed_lane_gives_no_more(
    ordered: list[int], pushed: list[int], lanes: dict[str, list[int]], steps: list[tuple[int, str | None]]
) -> None:
    """A walk over kept items, pushed items and lanes gives them all in the order one heap of them would, items
    pushed on the way included; once a lane is closed (after any item) none of its items comes any more."""
    numbers = itertools.count()

    def items(values: list[int], tag: str) -> list[Entry]:
        return sorted((v, next(numbers), tag) for v in values)

    kept, extra = items(ordered, "kept"), items(pushed, "pushed")
    lane_items = {key: items(values, key) for key, values in lanes.items()}
    walk = Walk(_AllCurrent(), kept, list(extra), lane_items)  # type: ignore[arg-type]
    heap = [*kept, *extra, *(item for lane in lane_items.values() for item in lane)]
    heapq.heapify(heap)
    closed: set[str] = set()
    for value, close in steps:
        expected = None
        while heap:
            candidate = heapq.heappop(heap)
            if candidate[2] not in closed:
                expected = candidate
                break
        got = walk.pop()
        assert got == expected
        if got is None:
            break
        assert walk.lane == (got[2] if got[2] in lane_items else None)
        item = (value, next(numbers), "pushed")
        walk.push(item)
        heapq.heappush(heap, item)
        if close is not None:
            walk.close(close)
            closed.add(close)
