"""The queue: priority class, then age protection, then reservations, then preemption standing, then the team's
fair share, then the order policy's rank, then submit time.

The rank is the policy's (`SchedulerConfig.order`): `fifo` ranks every job alike (submit time decides), `spf`
ranks by predicted remaining GPU-time (shortest first, Helios's QSSF), `las` by attained GPU-time (least first,
Tiresias). Whatever the rank, a job that has waited longer than `max_wait_s` is **aged**: it goes ahead of every
job of its priority that is not, in submit order, so no job waits without bound behind shorter ones. Where
`sticky_reservations` is on, a job that holds an EASY reservation keeps its place ahead of its peers in the next
cycles, so the small jobs of a team with a better standing do not take every GPU its draining node frees (off by
default: in the contended replays it starved the widest gangs, see docs/simulator.md).

Jobs are kept in sub-queues of identical (priority, standing, team, shape, preemptible: a job may override its
class's preemptibility, and only preemptible jobs borrow). Within one, later jobs can do nothing an earlier blocked
one could not (same needs, same rights), so a cycle looks only at sub-queue heads, merged in queue order: a cycle
costs O(sub-queues), not O(jobs), with 100,000 jobs waiting.

A sub-queue whose head its team's quota refuses is **parked** under (team, pool, preemptible, priority) until that
team may be admitted for such a head again (Kueue keeps inadmissible workloads aside the same way): with a
thousand teams at their quota, a cycle then walks the sub-queues that can move, not every one of them.
"""

import itertools
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from sys import intern
from typing import Any, Final

from chamber.common.contracts import GpuRef
from chamber.common.quota import QuotaUsage
from chamber.scheduler.core.model import PendingJob, Shape

QueueKey = tuple[Any, ...]
"""(priority, preemption standing, team, shape, preemptible): what a sub-queue's jobs share. Typed as a tuple of
`Any`, as `Order` and `ParkGroup` are, for the compiled core: mypyc keeps a tuple of fixed types as a C struct,
and made a new tuple object of it (with new floats) each time one went into a dict, a list, a heap or a comparison,
so a look-up never found its key by identity (6.5% of the `--quota` cycle's instructions went to building,
hashing, comparing and freeing such tuples); a tuple of `Any` stays the object it is."""
Order = tuple[Any, ...]
"""(class: int, -fair-share standing: float, rank: float, submitted at: float, id: str): smaller first. `class`
packs (-priority, not aged, not reserved, -preemption standing) into one integer that orders as the four would
(`order_key`): a cycle compares ~100,000 of these (in heaps, sorts and bisections), mostly of jobs alike in all
four, and each element compared is a call; packed, such a comparison looks at four elements, not seven."""
Rank = Callable[[PendingJob], float]
AGED = float("-inf")
ParkGroup = tuple[Any, ...]
"""(team: str, pool: str, preemptible: bool, priority: int): sub-queues whose heads the team's quota in that pool
refuses (a tuple of `Any`: see `QueueKey`)."""
Entry = tuple[Any, ...]
"""(*queue order, kind, number, a sub-queue or a parked group): one item of a cycle's walk, flat (one tuple
comparison, not two nested ones: ~20,000 are ordered). Items of equal order come sub-queues first (in the order
they were made), then parked groups (same), then sub-queues woken in the cycle (in the order they woke). A parked
group's item in the kept order (`JobQueue.heads`, kind GROUP) holds its `Parking`, which names the group: the
split looks at ~4,000 of them a cycle with a thousand teams, and finding each by its group in `JobQueue.parked`
(a hash of four fields, a probe) was a third of its time; items made during a cycle (WOKEN) hold the group."""
SUBQUEUE: Final = 0
GROUP: Final = 1
WOKEN: Final = 2
"""An item's kind (see `Entry`). `Final`, as the sides below: compiled, a constant imported from another module is
otherwise looked up by its name at each use."""
MAY_MOVE: Final = 0
BORROWS: Final = 1
IDLE: Final = 2
"""A parked group's side of the split (`Parking.split_side`)."""


@dataclass(eq=False)
class FloorClock:
    """Counts the changes to one team's guarantee floors (`SchedulingState.floors`): a sub-queue or parked group
    keeps the side of the split it was put on (`split`) while its team's count is the one it
    was put there at. One object per team, held by its sub-queues and groups: the split reads ~5,000 of them a
    cycle, and finding each team's count by name cost a look at its name and its key tuple, cold in memory."""

    changes: int = 0


def entry(order: Order, kind: int, number: int, item: "SubQueue | ParkGroup | Parking") -> Entry:
    return order + (kind, number, item)  # noqa: RUF005 (compiled, `(*order, ...)` builds a list first)


@dataclass(eq=False)
class SubQueue:
    key: QueueKey
    number: int
    """When it was made, among sub-queues (ties in queue order go to the older)."""
    heap: list[tuple[float, float, str, int]] = field(default_factory=list)
    """(rank, submitted at, job id, entry number); entries of removed (or re-ranked) jobs are skipped lazily."""
    parked: ParkGroup | None = None
    entry: Entry | None = None
    """Its item in the queue's kept walk order (`JobQueue.heads`); None while parked or changed since."""
    order: Order | None = None
    """The queue order its `entry` has."""
    head: PendingJob | None = None
    """Its first job, once `JobQueue.head_of` found it, until a job enters or leaves it: a cycle asks for the heads
    of the same sub-queues a few thousand times, each otherwise a look at its heap's top entry in two dicts."""
    head_order: tuple[int, Order] | None = None
    """(the queue's order epoch it was computed in, the queue order of `head`), kept with `head` while the standings
    and reservations are the same (`JobQueue.order_of`: asked ~1,500 times a cycle, mostly of heads it was asked of
    in earlier cycles; a head's order changes only when it ages, re-entering its sub-queue). An epoch, not the
    mappings themselves: a sub-queue not asked for a while would keep an old standings mapping alive."""
    split_clock: FloorClock | None = None
    """Its team's floor clock, once the split looked at it."""
    split_version: int = -1
    """The clock's count `split_lane` was worked out at."""
    split_lane: Shape | None = None
    """Its side of the split (`split`): None when its team's guarantee might admit its head,
    else its shape (its lane in the second pass). Kept while the team's floors are (with a thousand teams, ~85% of
    the split's items are as they were in the last cycle)."""


@dataclass
class Parking:
    order: Order
    """The queue order of its first head when parked: where the group comes up for a look in a cycle."""
    number: int
    """When it was made, among parked groups (ties in queue order go to the older)."""
    group: ParkGroup
    entry: Entry | None = None
    """Its item in the queue's kept walk order (`JobQueue.heads`); None once the group is woken whole."""
    entry_order: Order | None = None
    subqueues: list[tuple[int, int, SubQueue]] = field(default_factory=list)
    """(GPUs its head asked for, tie-break, sub-queue), smallest first."""
    min_gpus: int = 0
    """The GPUs of its smallest head (0: none), kept as `subqueues` changes (the split asks it of ~900 groups a
    cycle with a thousand teams: reading it from the list was a miss into the list and its first item)."""
    first: tuple[dict[str, float], dict[str, tuple[GpuRef, ...]], Order | None, SubQueue | None] | None = None
    """(the standings and reservations it was computed with, the least queue order among its heads now, the
    sub-queue of that head), kept while it stays true (`JobQueue.first_order`): a sub-queue parked into the group
    lowers it at most, and only a change to the first head's sub-queue, or a job entering one, makes it unknown."""
    lane_first: Any = None
    lane_standing: dict[str, float] | None = None
    lane_reserved: dict[str, tuple[GpuRef, ...]] | None = None
    lane_usage: QuotaUsage | None = None
    lane_cohort: tuple[str, str] = ("", "")
    lane_made: Entry | None = None
    """(the `first` it was made from, with its standings and reservations, the quota usage, the group's cohort lane,
    its item there): `JobQueue.lane_item`, kept while they are the same. Fields, not one tuple: the split asks this
    of ~1,700 groups a cycle, and each tuple it reads is a miss."""
    split_clock: FloorClock | None = None
    split_version: int = -1
    """Its team's floor clock and the count `split_side` was worked out at (see `SubQueue.split_version`)."""
    split_side: int = 0
    """Its side of the split (`split`): MAY_MOVE (its team is below its guarantee in the pool,
    or holds lower-priority work there), BORROWS (at or above it: its preemptible heads may only borrow) or IDLE (at
    or above it, with heads that do not borrow: nothing of the group moves)."""


class Walk:
    """A cycle's items in queue order: the kept order of `JobQueue.heads` read once from the front, merged with
    the items pushed during the cycle (sub-queues with a new head, woken sub-queues), as one heap of them all
    would give them, without building that heap.

    Items may also come in `lanes`, each already in queue order, merged in the same way; a lane `close`d gives
    no more items (the cycle found that none of its items left could do anything: see `_Cycle._walk`)."""

    def __init__(
        self,
        queue: "JobQueue",
        ordered: list[Entry],
        pushed: list[Entry] | None = None,
        lanes: dict[Any, list[Entry]] | None = None,
    ) -> None:
        self._queue = queue
        self._ordered = ordered
        self._next = 0
        self._pushed = pushed or []
        heapify(self._pushed)
        self._lanes = lanes or {}
        self._fronts: list[Entry] = []
        """The next item of each lane: a heap of the lanes' fronts (items, not tuples holding one: comparing a tuple
        that holds an item compares the two items twice, once for equality and once for order)."""
        self._lane_of: dict[int, tuple[Any, int]] = {}
        """id of a front -> (its lane, its index there). An item is in one lane only (`split`)."""
        for key, lane in self._lanes.items():
            if lane:
                self._fronts.append(lane[0])
                self._lane_of[id(lane[0])] = (key, 0)
        heapify(self._fronts)
        self._closed: set[Any] = set()
        self.lane: Any = None
        """The lane the item last popped came from (None: not from a lane)."""
        self._lane_next = 0
        """Where in `lane` its next item is."""

    def pop(self) -> Entry | None:
        """The next item, or None when there are no more."""
        ordered, queue, i, pushed, fronts = self._ordered, self._queue, self._next, self._pushed, self._fronts
        n = len(ordered)
        while i < n and not queue.current(ordered[i]):
            i += 1
        self._next = i
        lane_of = self._lane_of
        while fronts and lane_of[id(fronts[0])][0] in self._closed:
            del lane_of[id(heappop(fronts))]
        best = ordered[i] if i < n else None
        if pushed and (best is None or pushed[0] < best):
            best = pushed[0]
        if fronts and (best is None or fronts[0] < best):
            item = heappop(fronts)
            key, at = lane_of.pop(id(item))
            lane = self._lanes[key]
            if at + 1 < len(lane):
                after = lane[at + 1]
                heappush(fronts, after)
                lane_of[id(after)] = (key, at + 1)
            self.lane, self._lane_next = key, at + 1
            return item
        self.lane = None
        if best is None:
            return None
        if i < n and best is ordered[i]:
            self._next = i + 1
            return best
        return heappop(pushed)

    def push(self, item: Entry) -> None:
        heappush(self._pushed, item)

    def close(self, lane: Any) -> None:
        """No more items from `lane`."""
        self._closed.add(lane)

    def pushed(self) -> list[Entry]:
        """The items pushed during the walk and not given yet (in no particular order)."""
        return list(self._pushed)

    def rest(self) -> list[Entry]:
        """The items not yet given of the lane the last item came from (see `lane`)."""
        return self._lanes[self.lane][self._lane_next :] if self.lane is not None else []


def _fifo(job: PendingJob) -> float:
    return 0.0


class JobQueue:
    def __init__(self, standing_cap: int = 3, rank: Rank = _fifo, rank_first: bool = False, aging: bool = True) -> None:
        self.standing_cap = standing_cap
        self.rank = rank
        self.rank_first = rank_first
        """Order by rank before fair-share standing (standing then only breaks ties)."""
        self.jobs: dict[str, PendingJob] = {}
        self._subqueues: dict[QueueKey, SubQueue] = {}
        self._shapes: dict[Shape, Shape] = {}
        """Every shape a job waited with, one object each (a few dozen): equal shapes found by identity first."""
        self._where: dict[str, SubQueue] = {}
        self._rank_of: dict[str, float] = {}
        self._entry: dict[str, int] = {}
        """job -> the number of its one valid heap entry (older entries of the job are stale)."""
        self._entries = 0
        self.parked: dict[ParkGroup, Parking] = {}
        self._reserved: dict[str, tuple[GpuRef, ...]] = {}
        self._numbers = itertools.count()
        self.seq = itertools.count()
        """Numbers of the items a cycle's walk makes (woken sub-queues, groups in lanes: see `Entry`), from cycle to
        cycle: an item a group kept from an earlier cycle (`lane_item`) never shares one with a new item."""
        self._walk: list[Entry] = []
        """Every sub-queue's head and every parked group, in queue order, kept from cycle to cycle (`heads`)."""
        self._stale = 0
        """Items of `_walk` that no longer stand for anything (skipped, dropped when there are many)."""
        self._changed: set[SubQueue] = set()
        self._changed_groups: set[ParkGroup] = set()
        self._walk_standing: dict[str, float] | None = None
        """The standings `_walk` was ordered with (a new standings mapping re-orders it all)."""
        self._order_standing: dict[str, float] | None = None
        self._order_epoch = 0
        """Counts the standings mappings `order_of` was asked with and the reservations set (`SubQueue.head_order`).
        Standings and reservations are replaced, never changed in place."""
        self._same_class: dict[Any, Any] = {}
        self._same_float: dict[Any, Any] = {}
        """One object for each value of an order's class, standing and rank (those of the standings `order_of` was
        last asked with): a tuple comparison first looks for the first element that differs, and two elements that
        are one object are equal without a call (with a thousand teams, comparing orders of jobs alike in those
        three, each held as an object of its own, was a third of a cycle's instructions)."""
        self.aging = aging
        self._waiting: dict[str, dict[int, int]] = {}
        """team -> GPUs a job asks for -> how many such jobs of the team wait (`smallest_by_team`)."""
        self._smallest: dict[str, int] = {}
        """team -> the fewest GPUs any of its waiting jobs asks for (the least key of its `_waiting`)."""
        self._by_age: list[tuple[float, str]] = []
        """(submitted at, job id) of every job pushed and not yet aged (lazily cleaned): who ages next. Kept only
        when aging is on (with it off nothing would ever take entries out)."""

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def reserved(self) -> dict[str, tuple[GpuRef, ...]]:
        """Jobs that held a reservation at the end of the last full cycle, with the GPUs it planned on."""
        return self._reserved

    @reserved.setter
    def reserved(self, reserved: dict[str, tuple[GpuRef, ...]]) -> None:
        if reserved or self._reserved:
            self._walk_standing = None  # a reservation orders its job ahead: the kept order is re-made
        self._reserved = reserved
        self._order_epoch += 1

    def key_of(self, job: PendingJob) -> QueueKey:
        return (job.priority, min(job.preemptions, self.standing_cap), job.team, job.shape, job.preemptible)

    def push(self, job: PendingJob) -> None:
        if job.id in self.jobs:
            self.remove(job.id)
        canonical = self._shapes.get(job.shape)
        if canonical is None:
            self._shapes[job.shape] = job.shape
        elif canonical is not job.shape:
            job.shape = canonical  # one object per shape: the cycle's dict and set lookups then match by identity
        job.team = intern(job.team)  # one string per team: a (team, pool) key then matches its own by identity
        key = self.key_of(job)
        sq = self._subqueues.get(key)
        if sq is None:
            sq = self._subqueues[key] = SubQueue(key, next(self._numbers))
        rank = AGED if job.aged else self.rank(job)
        self._enter(sq, rank, job)
        self.jobs[job.id] = job
        self._where[job.id] = sq
        team, gpus = key[2], key[3].gpus
        counts = self._waiting.setdefault(team, {})
        counts[gpus] = counts.get(gpus, 0) + 1
        least = self._smallest.get(team)
        if least is None or gpus < least:
            self._smallest[team] = gpus
        if self.aging and not job.aged:
            heappush(self._by_age, (job.submitted_at, job.id))

    def remove(self, job_id: str) -> PendingJob | None:
        """Remove a job (lazily: its heap entry is skipped when it reaches the top)."""
        sq = self._where.pop(job_id, None)
        if sq is not None:
            sq.head = sq.head_order = None
            self._changed.add(sq)
            self._head_moved(sq, entered=False)
            team, gpus = sq.key[2], sq.key[3].gpus
            counts = self._waiting[team]
            counts[gpus] -= 1
            if not counts[gpus]:
                del counts[gpus]
                if not counts:
                    del self._waiting[team]
                    del self._smallest[team]
                elif self._smallest[team] == gpus:
                    self._smallest[team] = min(counts)
        self._rank_of.pop(job_id, None)
        self._entry.pop(job_id, None)
        return self.jobs.pop(job_id, None)

    def _enter(self, sq: SubQueue, rank: float, job: PendingJob) -> None:
        sq.head = sq.head_order = None
        self._changed.add(sq)
        self._head_moved(sq, entered=True)
        self._entries += 1
        self._entry[job.id] = self._entries
        self._rank_of[job.id] = rank
        heappush(sq.heap, (rank, job.submitted_at, job.id, self._entries))

    def _head_moved(self, sq: SubQueue, *, entered: bool) -> None:
        """A job entered or left `sq`: if it is parked, its group's first order is computed again, unless a job
        left a sub-queue other than the first head's (the first head is still there, and still first: the next
        head there comes no earlier than the one that left, unless a reservation orders a job ahead of its head)."""
        parking = self.parked.get(sq.parked) if sq.parked is not None else None
        if parking is not None and (entered or self._reserved or parking.first is None or parking.first[3] is sq):
            parking.first = None

    def age(self, now: float, max_wait_s: float) -> int:
        """Age every job submitted more than `max_wait_s` before `now` (it moves to the front of its sub-queue,
        and its sub-queue's head order says aged). O(log n) per job aged, once; returns how many aged."""
        by_age, jobs = self._by_age, self.jobs
        aged = 0
        while by_age and by_age[0][0] <= now - max_wait_s:
            _, job_id = heappop(by_age)
            job = jobs.get(job_id)
            sq = self._where.get(job_id)
            if job is None or sq is None or job.aged:
                continue
            job.aged = True
            self._enter(sq, AGED, job)
            aged += 1
        return aged

    def head(self, key: QueueKey) -> PendingJob | None:
        sq = self._subqueues.get(key)
        return None if sq is None else self.head_of(sq)

    def head_of(self, sq: SubQueue) -> PendingJob | None:
        """The sub-queue's first job (skipping the lazily removed ones); an emptied sub-queue is dropped."""
        if sq.head is not None:
            return sq.head
        heap, where, entry = sq.heap, self._where, self._entry
        while heap:
            _, _, job_id, n = heap[0]
            if where.get(job_id) is sq and entry.get(job_id) == n:
                head = sq.head = self.jobs[job_id]
                return head
            heappop(heap)
        if self._subqueues.get(sq.key) is sq:
            del self._subqueues[sq.key]
        self._drop(sq)
        return None

    def rank_of(self, job: PendingJob) -> float:
        return self._rank_of.get(job.id, 0.0)

    def order_of(self, job: PendingJob, standing: dict[str, float]) -> Order:
        if standing is not self._order_standing:
            self._order_standing = standing
            self._order_epoch += 1
            self._same_float.clear()
        sq = self._where.get(job.id)
        if sq is not None and sq.head is job:
            cached = sq.head_order
            if cached is not None and cached[0] == self._order_epoch:
                return cached[1]
        else:
            sq = None
        key = order_key(job, standing, self.standing_cap, self._rank_of.get(job.id, 0.0), job.id in self.reserved)
        # (`Any`, not `int` and `float`: compiled, a native number is boxed anew wherever it goes into a tuple)
        cls: Any = self._same_class.setdefault(key[0], key[0])
        same = self._same_float
        standing_of: Any = same.setdefault(key[1], key[1])
        rank: Any = same.setdefault(key[2], key[2])
        key = (cls, rank, standing_of, key[3], key[4]) if self.rank_first else (cls, standing_of, rank, key[3], key[4])
        if sq is not None:
            sq.head_order = (self._order_epoch, key)
        return key

    def smallest_by_team(self) -> dict[str, int]:
        """Per team with jobs waiting, the fewest GPUs any of them asks for (O(teams))."""
        return dict(self._smallest)

    def lane_item(self, item: Entry, standing: dict[str, float], usage: QuotaUsage) -> tuple[Any, Entry] | None:
        """For an item of `heads` standing for a parked group while it is `current`: (its cohort lane,
        `usage.cohort_of`, the group's item there: `first_order`, WOKEN, a number of `seq`); else None. The same
        item as in the last cycle while the group's first order and the quota usage are the same (a cycle asks
        this of ~2,000 groups with a thousand teams, most of them as they were)."""
        parking = item[-1]
        if parking.__class__ is not Parking or parking.entry is not item:
            return None
        return self.lane_item_of(item, parking, standing, usage)

    def lane_item_of(
        self, item: Entry, parking: Parking, standing: dict[str, float], usage: QuotaUsage
    ) -> tuple[Any, Entry] | None:
        """`lane_item` for a current item of `parking`."""
        made = parking.lane_made
        if (  # the common case, from the parking's own fields: as in the last cycle
            made is not None
            and parking.lane_standing is standing
            and parking.lane_reserved is self._reserved
            and parking.lane_usage is usage
            and parking.lane_first is parking.first
        ):
            return parking.lane_cohort, made
        group = parking.group
        cached = parking.first
        if cached is None or cached[0] is not standing or cached[1] is not self._reserved:
            self.first_order(group, standing)
            cached = parking.first
            assert cached is not None
        order = cached[2]
        if order is None:
            return None
        # The stored tuple itself, as an object: compiled (mypyc), a local of a fixed-length tuple type may hold a
        # copy of it, and `is` would never find the one the lane item was made from.
        first: object = parking.first
        made = order + (WOKEN, next(self.seq), group)  # noqa: RUF005 (see `entry`)
        cohort = usage.cohort_of(group[0], group[1])
        parking.lane_first, parking.lane_standing, parking.lane_reserved = first, standing, self._reserved
        parking.lane_usage, parking.lane_cohort, parking.lane_made = usage, cohort, made
        return cohort, made

    def first_order(self, group: ParkGroup, standing: dict[str, float]) -> Order | None:
        """The least queue order among a parked group's heads now (None: no heads), computed again only after one
        of its sub-queues changed (a job entered or left one, one was parked into it or woken from it), or when the
        standings or the reservations are others (a reservation orders its job ahead)."""
        parking = self.parked.get(group)
        if parking is None:
            return None
        cached = parking.first
        if cached is not None and cached[0] is standing and cached[1] is self._reserved:
            return cached[2]
        first: Order | None = None
        first_sq: SubQueue | None = None
        for _, _, sq in parking.subqueues:
            head = self.head_of(sq)
            if head is None:
                continue
            order = self.order_of(head, standing)
            if first is None or order < first:
                first, first_sq = order, sq
        parking.first = (standing, self._reserved, first, first_sq)
        return first

    def subqueues(self) -> list[SubQueue]:
        """The sub-queues a cycle walks: every one not parked."""
        return [sq for sq in self._subqueues.values() if sq.parked is None]

    def heads(self, standing: dict[str, float]) -> list[Entry]:
        """Every sub-queue a cycle walks (by its head's order) and every parked group (by its `order`), in queue
        order (see `Entry`). Kept sorted from cycle to cycle: only the sub-queues a job entered, left or aged in
        since, and the groups parked into, are placed again, so a cycle with ~20,000 sub-queues neither re-orders
        nor re-heaps them all (all are re-ordered when the standings or reservations change).

        The list is the cycle's to read with `walk`, until the next call; an item is `current` while what it
        stands for is unchanged since this call (changes within the cycle are placed at the next)."""
        if standing is not self._walk_standing:
            self._walk_standing = standing
            self._walk, self._stale = [], 0
            for sq in self._subqueues.values():
                sq.entry = None
                self._changed.add(sq)
            for group, parking in self.parked.items():
                parking.entry = None
                self._changed_groups.add(group)
        new: list[Entry] = []
        for sq in self._changed:
            if sq.parked is not None or self._subqueues.get(sq.key) is not sq:
                self._drop(sq)
                continue
            job = self.head_of(sq)
            if job is None:
                continue
            order = self.order_of(job, standing)
            if sq.entry is not None and sq.order == order:
                continue
            self._drop(sq)
            sq.order, sq.entry = order, entry(order, SUBQUEUE, sq.number, sq)
            new.append(sq.entry)
        self._changed.clear()
        for group in self._changed_groups:
            changed = self.parked.get(group)
            if changed is None or (changed.entry is not None and changed.entry_order == changed.order):
                continue
            if changed.entry is not None:
                self._stale += 1
            changed.entry_order, changed.entry = changed.order, entry(changed.order, GROUP, changed.number, changed)
            new.append(changed.entry)
        self._changed_groups.clear()
        kept = self._walk
        if self._stale > max(1024, len(kept) // 4):
            kept = [e for e in kept if self.current(e)]
            self._stale = 0
        if len(new) > len(kept) // 8:
            kept += new
            kept.sort()
        elif new:  # each new item where it goes (a full merge would compare each kept item too)
            new.sort()
            merged: list[Entry] = []
            at = 0
            for item in new:
                to = bisect_left(kept, item, at)
                merged += kept[at:to]
                merged.append(item)
                at = to
            merged += kept[at:]
            kept = merged
        self._walk = kept
        return kept

    def current(self, entry: Entry) -> bool:
        """Whether an item of `heads` still stands for its sub-queue (same head, not parked) or parked group."""
        item = entry[-1]
        if isinstance(item, SubQueue):
            sq: SubQueue = item  # (typed: reached through `Any`, each field was a generic look-up, compiled)
            return sq.entry is entry
        if isinstance(item, Parking):
            kept: Parking = item  # (a group's Parking forgets its item once it is woken whole)
            return kept.entry is entry
        parking = self.parked.get(item)
        return parking is not None and parking.entry is entry

    def _drop(self, sq: SubQueue) -> None:
        if sq.entry is not None:
            sq.entry = None
            self._stale += 1

    def park(self, job: PendingJob, group: ParkGroup, order: Order) -> None:
        """Set `job`'s sub-queue aside until its team's quota may admit `job` (see `wake`)."""
        sq = self._where.get(job.id)
        if sq is None or sq.parked is not None:
            return
        sq.parked = group
        self._drop(sq)
        parking = self.parked.get(group)
        if parking is None:
            parking = self.parked[group] = Parking(order, next(self._numbers), group)
        parking.order = min(parking.order, order)
        cached = parking.first
        if cached is not None and self.head_of(sq) is job:  # `order` is its head's, as the queue is now
            if cached[2] is None or order < cached[2]:
                parking.first = (cached[0], cached[1], order, sq)
        else:
            parking.first = None
        self._changed_groups.add(group)
        insort(parking.subqueues, (job.shape.gpus, id(sq), sq))  # ids differ: a sub-queue is never compared
        parking.min_gpus = parking.subqueues[0][0]

    def wake(self, group: ParkGroup, up_to_gpus: int | None = None) -> list[SubQueue]:
        """Back into the cycle: the group's sub-queues whose heads asked for at most `up_to_gpus` (all: None)."""
        parking = self.parked.get(group)
        if parking is None:
            return []
        n = len(parking.subqueues)
        if up_to_gpus is not None:
            n = bisect_right(parking.subqueues, up_to_gpus, key=lambda item: item[0])
        woken = [sq for _, _, sq in parking.subqueues[:n]]
        for sq in woken:
            sq.parked = None
            self._changed.add(sq)
        del parking.subqueues[:n]
        parking.min_gpus = parking.subqueues[0][0] if parking.subqueues else 0
        if parking.first is not None and any(sq is parking.first[3] for sq in woken):
            parking.first = None
        if not parking.subqueues:
            del self.parked[group]
            if parking.entry is not None:
                parking.entry = None
                self._stale += 1
        return woken

    def wake_one(self, group: ParkGroup, sq: SubQueue) -> None:
        """Back into the cycle: one sub-queue of the group (see `_Cycle._wake_in_turn`)."""
        parking = self.parked.get(group)
        if parking is None or sq.parked != group:
            return
        sq.parked = None
        self._changed.add(sq)
        parking.subqueues = [item for item in parking.subqueues if item[2] is not sq]
        parking.min_gpus = parking.subqueues[0][0] if parking.subqueues else 0
        if parking.first is not None and parking.first[3] is sq:
            parking.first = None
        if not parking.subqueues:
            del self.parked[group]
            if parking.entry is not None:
                parking.entry = None
                self._stale += 1

    def wake_all(self) -> None:
        for group in list(self.parked):
            self.wake(group)

    def is_head(self, job: PendingJob) -> bool:
        sq = self._where.get(job.id)
        return sq is not None and self.head(sq.key) is job

    def after_head(self, key: QueueKey, limit: int) -> Iterator[PendingJob]:
        """Up to `limit` jobs of a sub-queue after its head, in order (for backfill look-ahead)."""
        sq = self._subqueues.get(key)
        if sq is None:
            return
        where, entry = self._where, self._entry
        seen: set[str] = set()
        for _, _, job_id, n in smallest(sq.heap, limit + 1):
            if where.get(job_id) is not sq or entry.get(job_id) != n:
                continue  # removed, or a stale entry of a job pushed again or aged since
            seen.add(job_id)
            if len(seen) == 1:
                continue
            yield self.jobs[job_id]


def smallest(heap: list[Any], k: int) -> list[Any]:
    """The `k` smallest items of a heap, in order, as `heapq.nsmallest` gives them, in O(k log k): it follows the
    heap's own order from the root instead of scanning every item (a sub-queue's heap holds thousands of jobs, and
    the backfill look-ahead asks for a few of them after each blocked head)."""
    out: list[Any] = []
    if not heap or k <= 0:
        return out
    frontier = [(heap[0], 0)]
    n = len(heap)
    while frontier and len(out) < k:
        item, i = heappop(frontier)
        out.append(item)
        for child in (2 * i + 1, 2 * i + 2):
            if child < n:
                heappush(frontier, (heap[child], child))
    return out


def order_key(
    job: PendingJob, standing: dict[str, float], cap: int, rank: float = 0.0, reserved: bool = False
) -> Order:
    """Smaller comes first; `rank` is the head's rank in its sub-queue (see `JobQueue.rank_of`). The class is
    (-priority, not aged, not reserved, -min(preemptions, cap)) in mixed radix: the last three are digits of 2, 2 and
    cap + 1 values (the standing as cap - min(preemptions, cap), which orders as its negation does)."""
    standing_digit = cap - min(job.preemptions, cap)
    cls = ((-job.priority * 2 + (not job.aged)) * 2 + (not reserved)) * (cap + 1) + standing_digit
    return (cls, -standing.get(job.team, 0.0), AGED if job.aged else rank, job.submitted_at, job.id)
