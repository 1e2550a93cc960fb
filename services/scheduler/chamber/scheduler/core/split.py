"""The walk's items split, before the first pass, into those whose team's guarantee might admit a head now (the
first pass's) and the rest, straight to the second pass in lanes: its sub-queues at their turn, and its
parked groups at their first head's turn (as `_walk` hands a group on). A team at or above its guarantee in
every pool the head may use, with no lower-priority preemptible work there to displace, can only borrow: the
first pass would only set such a head aside for the second (or, when its quota refuses even that, park it,
which the second pass does as well, its usage having only grown), and would only decide to hand such a
parked group to the second pass (`_wake`). With a thousand teams at their quota that look was most of the
first pass. Both only grow harder within a cycle (usage only grows, and a team's lower-priority work placed
in the first pass comes after its higher-priority heads), so nothing of the second pass's could have moved
in the first. Nor does the split move where the backfill budget goes: a head refused outright gets no
look-ahead in either pass.

The second pass's items come in lanes, each in queue order (`Walk` merges them), which `_walk` closes once
none of their items left could do anything in the cycle:
- a parked group's lane is its (pool, cohort): its team borrows for it or not at all, and what a cohort may
  lend only shrinks within the cycle, so once one of a lane's groups finds it lends nothing, its other
  groups would wake nothing (with a thousand teams at their quota, most of the second pass's groups were
  looked at only for that). A group of non-preemptible jobs of such a team is left out at once: only
  preemptible jobs borrow;
- a sub-queue's lane is its shape: such a team may neither displace nor reclaim, so its head starts only on
  free GPUs (or backfilled, or on room opened for it), and once a head of the shape finds none of those
  (`_shape_hopeless`), or too few GPUs are left free for the shape (`_no_room_left`), no later head of it
  would start (most of the second pass's heads, on a full fleet).
Such a team stays such for the whole cycle: the first pass does not borrow, and where a team is at its
guarantee it gives the team only work above the team's lowest preemptible work there (by displacing it),
so above the lane's heads. Before the first pass stopped borrowing, a job that may use several pools could
borrow in one in the first pass, and its team's groups had to leave their lanes for the second.

What the split concludes of an item (its side) is kept on its sub-queue or group while its team's floors are the
same (`SchedulingState.floor_clocks`): with a thousand teams, ~85% of the ~5,000 items are on the side they were
on in the last cycle. The loop over them is written for the compiled core: each item's sub-queue or parking is
read into a local of its own type (an item is a tuple of `Any`, and reaching its fields through `Any` was a
generic attribute look-up each, most of the split's instructions), and the looks it needs (`floor_of`,
`may_move`) are methods, not closures (a closure is called as a Python object).
"""

from typing import TYPE_CHECKING

from chamber.scheduler.core.model import Shape
from chamber.scheduler.core.queue import BORROWS, IDLE, MAY_MOVE, Entry, ParkGroup, Parking, SubQueue
from chamber.scheduler.core.state import SchedulingState

if TYPE_CHECKING:
    from chamber.scheduler.core.cycle import CycleContext

Lane = tuple[str, str] | Shape
"""A lane of the second pass: parked groups by (pool, cohort), or sub-queues by shape."""


class Split:
    """One cycle's split (`run`), with the looks it asks of teams kept for the cycle."""

    def __init__(self, state: SchedulingState, ctx: "CycleContext", reclaim_past_guarantee: bool) -> None:
        book = state.quota
        assert book is not None
        self.state = state
        self.ctx = ctx
        self.floor = state.floors
        """(team, pool) -> the priority a head must exceed for the guarantee to admit it (-inf: below it), kept
        across cycles (`SchedulingState.floors`)."""
        self.left_of: dict[tuple[str, str], int] = {}
        """(team, pool) -> GPUs left of its guarantee, as the cycle starts."""
        self.lends_of: dict[tuple[str, str], int] = {}
        """(team, pool) -> GPUs its cohort could lend it, as the cycle starts (asked only for preemptible groups)."""
        self.passing = ctx.reclaimable and reclaim_past_guarantee
        self.smallest: dict[str, int] = ctx.smallest_waiting(state) if self.passing else {}

    def floor_of(self, team: str, pool: str) -> float:
        """The team's floor in `pool`, worked out and kept (`floor`)."""
        state = self.state
        book = state.quota
        assert book is not None
        if state.usage.used_in(team, pool) < book.quota(team, pool).nominal:
            found = float("-inf")
        else:
            held = state.preemptible_held(team, pool)
            found = float("inf")
            if held:
                for p, n in held.items():
                    if n > 0 and p < found:
                        found = float(p)  # (priorities are small integers: exact as floats)
        self.floor[(team, pool)] = found
        return found

    def may_move(self, group: ParkGroup, parking: Parking) -> bool:
        """Whether the first pass might wake a sub-queue of this parked group of a team below its guarantee (or
        holding lower-priority work to displace), or hand the group to the second pass (`_wake`): its smallest
        head is within what is left of the guarantee, or the team may displace, or reclaim past its guarantee for
        it, or the cohort may lend for it, all as the cycle starts (they only get harder within it). When not, the
        group is left out of the cycle (with a thousand teams, most of the first pass's groups were of
        non-preemptible jobs of a team at its guarantee, looked at only to find that its lower-priority work is too
        little to make room for their smallest head by displacing it)."""
        state = self.state
        book = state.quota
        assert book is not None
        team, pool, preemptible, priority = group
        gpus = parking.min_gpus
        key = (team, pool)
        left = self.left_of.get(key)
        if left is None:
            left = self.left_of[key] = book.quota(team, pool).nominal - state.usage.used_in(team, pool)
        if gpus <= left:
            return True
        lower = state.preemptible_below(team, pool, priority)
        if not preemptible:  # it neither borrows nor goes past a guarantee: it may only displace all it lacks
            return gpus - left <= lower
        if lower > 0:
            return True
        if self.passing and left > 0 and gpus <= self.smallest.get(team, gpus):
            return True
        lends = self.lends_of.get(key)
        if lends is None:
            lends = self.lends_of[key] = state.usage.borrowable(team, pool)
        return gpus - max(left, 0) <= lends

    def side_of(self, sq: SubQueue) -> Shape | None:
        """A sub-queue's side, worked out: None when its team's guarantee might admit its head in a pool its shape
        may use (or it may use none), else its shape."""
        state, floor = self.state, self.floor
        priority, _, team, shape, _ = sq.key
        pools = self.ctx.pools_of(state, shape)
        side: Shape | None = None if not pools else shape
        for pool in pools:
            f = floor.get((team, pool))
            if (self.floor_of(team, pool) if f is None else f) < priority:
                return None
        return side

    def group_side(self, parking: Parking) -> int:
        """A parked group's side, worked out (see `Parking.split_side`)."""
        group = parking.group
        f = self.floor.get((group[0], group[1]))
        if (self.floor_of(group[0], group[1]) if f is None else f) < group[3]:
            return MAY_MOVE
        return BORROWS if group[2] else IDLE  # at its guarantee a team borrows only with preemptible jobs

    def run(self, items: list[Entry]) -> tuple[list[Entry], dict[Lane, list[Entry]]]:
        """(the first pass's items, the second pass's lanes), from the kept walk order `items`."""
        state = self.state
        index = state.index
        if state.split_index is not index or state.split_partitions != index.partition_count():
            state.split_index, state.split_partitions = index, index.partition_count()
            state.forget_sides()  # the pools a shape may use changed: every sub-queue's side is worked out again
        # ~5,000 items a cycle with a thousand teams: the loop is kept lean. An item no longer current is left out
        # (the walk would pass it by: `JobQueue.current`); a current one's side is kept from the last cycle while
        # its team's floors are the same.
        first: list[Entry] = []
        lanes: dict[Lane, list[Entry]] = {}
        parked: list[tuple[Entry, Parking]] = []
        for item in items:
            what = item[-1]
            if isinstance(what, SubQueue):
                sq: SubQueue = what
                if sq.entry is not item:
                    continue
                clock = sq.split_clock
                if clock is not None and sq.split_version == clock.changes:
                    side = sq.split_lane
                else:
                    side = self.side_of(sq)
                    clock = sq.split_clock = state.floor_clock(sq.key[2])
                    sq.split_version, sq.split_lane = clock.changes, side
                if side is None:
                    first.append(item)
                else:
                    lane = lanes.get(side)
                    if lane is None:
                        lane = lanes[side] = []
                    lane.append(item)  # `items` is in queue order: so is each lane
            else:
                parking: Parking = what
                if parking.entry is not item:
                    continue
                group_clock = parking.split_clock
                if group_clock is None or parking.split_version != group_clock.changes:
                    group_clock = parking.split_clock = state.floor_clock(parking.group[0])
                    parking.split_version, parking.split_side = group_clock.changes, self.group_side(parking)
                group_side = parking.split_side
                if group_side == BORROWS:
                    parked.append((item, parking))
                elif group_side == MAY_MOVE and self.may_move(parking.group, parking):
                    first.append(item)
        queue, standing, totals = state.queue, state.standing, state.usage
        for item, parking in parked:
            if (found := queue.lane_item_of(item, parking, standing, totals)) is not None:
                lane = lanes.get(found[0])
                if lane is None:
                    lane = lanes[found[0]] = []
                lane.append(found[1])
        for key, lane in lanes.items():
            if not isinstance(key, Shape):
                lane.sort()
        return first, lanes
