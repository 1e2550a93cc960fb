"""In the second pass, a parked group of a team that may only borrow wakes one sub-queue at a time, the one whose
head comes first in queue order among those its quota admits, at that head's turn (`_Cycle._wake_in_turn`).
Before, the group woke every admitted sub-queue at its turn; with a thousand teams at their quota the first woken
head borrowed what the cohort lent, and every other one was looked at in full only to be refused and parked again.

The claim: this changes no placement, preemption or nomination. On any quotas in two pools, cohorts, running work,
queue and arrivals, three decision rounds decide exactly what waking every admitted sub-queue at once decides
(the old way, kept here as the reference), in the same order, when the test budget does not cut a pass short;
only the refusals of heads that were woken for nothing are gone. Not in a strict order (`strict_fifo`,
`strict_fifo_per_team`), where a refused head ends the walk or its team's turn: there every admitted head still
wakes at its group's turn (the last test)."""

from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.scheduler.core.cycle import _Cycle
from chamber.scheduler.core.decisions import Decision, Place, Wait
from chamber.scheduler.core.model import PendingJob
from chamber.scheduler.core.placement import find_placement
from chamber.scheduler.core.queue import WOKEN, Entry, ParkGroup, Walk, entry
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import pool_quota
from tests.support.core import pure_core_only
from tests.unit.scheduler.test_guarantee_split import POOLS, TEAMS, Job, Situation, book, job, moves


def wake_all_admitted(self: _Cycle, group: ParkGroup, room: int, popped: Entry, heads: Walk) -> None:
    """The old way: every sub-queue whose head the quota admits now wakes at the group's turn, each then taken at
    its own head's turn."""
    queue = self.state.queue
    parking = queue.parked.get(group)
    if parking is None:
        return
    top = min(parking.subqueues[-1][0], room)
    woken = queue.wake(group, top) if top >= parking.min_gpus else []
    if not woken and heads.lane is not None and self.state.usage.borrowable(group[0], group[1]) <= 0:
        heads.close(heads.lane)
    for sq in woken:
        head = queue.head_of(sq)
        if head is not None:
            heads.push(entry(queue.order_of(head, self.state.standing), WOKEN, next(self.ctx.seq), sq))


@st.composite
def borrowers(draw: st.DrawFn) -> Situation:
    """Teams at their guarantee with many preemptible heads of several sizes (groups of several sub-queues),
    cohort-mates whose idle guarantee lends a few GPUs at a time, GPUs free beyond what is lent, and jobs
    ending between cycles: the cases where waking every admitted head at once woke some for nothing."""
    pool = POOLS[0]
    quotas: dict[tuple[str, str], tuple[int, int | None]] = {(t, p): (0, None) for t in TEAMS for p in POOLS}
    running: list[Job] = []
    for t in TEAMS:
        nominal = draw(st.integers(0, 6))
        quotas[(t, pool)] = (nominal, draw(st.none() | st.integers(0, 6)))
        used = draw(st.integers(0, nominal))
        while used > 0:  # what it runs of its guarantee, in preemptible jobs of a class its heads share
            gpus = min(used, draw(st.sampled_from([1, 2, 4])))
            running.append((t, draw(st.sampled_from(["research", "best-effort"])), gpus, pool, 500.0))
            used -= gpus
    queued = draw(st.lists(st.tuples(
        st.sampled_from(TEAMS[:3]), st.sampled_from(["research", "best-effort"]), st.sampled_from([1, 1, 2, 3, 4, 8]),
        st.sampled_from([None, pool]), st.none() | st.sampled_from([50.0, 500.0]),
    ), min_size=10, max_size=50))  # fmt: skip
    return Situation(
        nodes={pool: draw(st.integers(2, 4)), POOLS[1]: 0},
        quotas=quotas,
        cohorts={t: draw(st.sampled_from(["c1", "c2"])) for t in TEAMS},
        running=running,
        queued=queued,
        ends=draw(st.lists(st.integers(0, 40), min_size=3, max_size=24)),
        standing={t: draw(st.sampled_from([-1.0, 0.0, 1.0])) for t in TEAMS},
        backfill_budget=draw(st.sampled_from([1, 3, 512])),
    )


def rounds(situation: Situation) -> list[list[Decision]]:
    """Four cycles: a third of the queue before each of the first three, some running jobs ending before each
    of the last three (the jobs each cycle placed run on)."""
    state = SchedulingState(SchedulerConfig(max_tests_per_cycle=10**9, backfill_budget=situation.backfill_budget))
    for pool in POOLS:
        for i in range(situation.nodes[pool]):
            state.index.add_node(f"{pool}-{i}", pool=pool, model="H100", rack="r", zone="z", capacity=8,
                                 free=range(8))  # fmt: skip
    state.set_quota(book(situation), standing=situation.standing)
    for i, spec in enumerate(situation.running):
        pending = job(f"r{i}", spec, float(i))
        where = find_placement(state.index, pending.shape)
        if where is not None:
            state.place(pending, where, "running", float(i), borrowing=False)
    state.mark_borrowed()
    out = []
    third = -(-len(situation.queued) // 3)
    for n in range(4):
        for i, spec in enumerate(situation.queued[n * third : (n + 1) * third], start=n * third):
            state.add(job(f"q{i}", spec, 100.0 * n + i))
        if n:
            running = sorted(state.running)
            for i in situation.ends[n - 1 :: 3]:
                if running and running[i % len(running)] in state.running:
                    state.release(running[i % len(running)])
        out.append(state.cycle(100.0 * n + 99))
    return out


@pure_core_only
@settings(max_examples=300, deadline=None)
@given(borrowers())
def test_waking_in_turn_decides_what_waking_every_admitted_head_decides(situation: Situation) -> None:
    lazy = rounds(situation)
    with patch.object(_Cycle, "_wake_in_turn", wake_all_admitted):
        eager = rounds(situation)
    assert moves(lazy) == moves(eager)


def lenders(config: SchedulerConfig | None = None) -> SchedulingState:
    """Two 8-GPU nodes, a pool of 8 GPUs in quotas, one cohort: a (guarantee 6) runs ra on 6 GPUs, b (guarantee
    2) runs rb on 2. GPUs are free, but the cohort lends nothing until ra ends."""
    state = SchedulingState(config)
    for node in ("n0", "n1"):
        state.index.add_node(node, pool="default", model="H100", rack="r", zone="z", capacity=8, free=range(8))
    state.set_quota(pool_quota(8, ("a", "c1", 6, None), ("b", "c1", 2, None)))
    for job_id, spec in (("ra", ("a", "train", 6, None, None)), ("rb", ("b", "research", 2, None, None))):
        running = job(job_id, spec, 0.0)
        where = find_placement(state.index, running.shape)
        assert where is not None
        state.place(running, where, "running", 0.0, borrowing=False)
    return state


@pure_core_only
def test_a_head_the_cohort_no_longer_lends_enough_for_is_not_woken() -> None:
    """Two 8-GPU nodes, a pool of 8 GPUs in quotas. b (guarantee 2) runs its 2 GPUs and waits with 1-, 2- and
    4-GPU jobs, parked while a (guarantee 6) uses all of its guarantee: GPUs are free, but nothing is lent. a's
    job ends: the cohort lends 6. b's 1- and 2-GPU heads borrow 3 of them, in queue order; the 4-GPU head is not
    woken (3 are left to lend), so it is neither looked at nor refused again."""
    state = lenders()
    for i, gpus in enumerate((1, 2, 4)):
        state.add(job(f"b{gpus}", ("b", "research", gpus, None, None), 100.0 + i))
    first = state.cycle(200.0)
    assert {d.job_id for d in first if isinstance(d, Wait)} == {"b1", "b2", "b4"}  # nothing to lend: parked
    assert len(state.queue.parked) == 1

    looked: list[str] = []
    consider = _Cycle.consider

    def spying(self: _Cycle, pending: PendingJob, decisions: list[Decision]) -> str:
        looked.append(pending.id)
        return consider(self, pending, decisions)

    state.release("ra")
    with patch.object(_Cycle, "consider", spying):
        second = state.cycle(300.0)
    assert [(type(d).__name__, d.job_id) for d in second] == [("Place", "b1"), ("Place", "b2")]
    assert all(isinstance(d, Place) and d.reason.endswith("borrowing idle quota") for d in second)
    assert looked == ["b1", "b2"]
    assert "b4" in state.queue.jobs


def strict_second_cycle(config: SchedulerConfig) -> list[str]:
    """As the test above, with a second 1-GPU job behind b1, in a strict order (one more sub-queue parks per
    cycle there, the walk stopping at it): the jobs placed in the cycle after a's job ends."""
    state = lenders(config)
    for i, (name, gpus) in enumerate((("b1", 1), ("b2", 2), ("b4", 4), ("b1-again", 1))):
        state.add(job(name, ("b", "research", gpus, None, None), 100.0 + i))
    for t in (200.0, 210.0, 220.0):
        state.cycle(t)
    assert [len(p.subqueues) for p in state.queue.parked.values()] == [3]
    state.release("ra")
    return [d.job_id for d in state.cycle(300.0) if isinstance(d, Place)]


@pytest.mark.parametrize(
    "config", [SchedulerConfig(strict_fifo=True), SchedulerConfig(strict_fifo_per_team=True)], ids=["fifo", "team"]
)
def test_in_a_strict_order_a_head_refused_at_its_turn_still_ends_the_walk(config: SchedulerConfig) -> None:
    """Found by review: in a strict order, a head refused at its turn ends the walk (or its team's turn). The
    cohort lends 6: b1 and b2 borrow 3, and b4, woken with them, is refused at its turn, so b1-again (behind b1)
    is not placed. Waking one head at a time never woke b4, and the walk went on to place b1-again; in a strict
    order every admitted head wakes at the group's turn, as before."""
    assert strict_second_cycle(config) == ["b1", "b2"]
