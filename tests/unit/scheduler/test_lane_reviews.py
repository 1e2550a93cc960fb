"""Cases a review found where closing shape lanes changed decisions (each fails without its fix), and one where
consolidation gave a gang to a team whose budget blocks it. See `test_shape_lanes` for the claim."""

import random
from collections.abc import Callable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import GpuRef, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import validate
from chamber.scheduler.core.decisions import Decision, Nominate
from chamber.scheduler.core.model import PendingJob
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.core import COMPILED, pure_core_only
from tests.unit.scheduler.test_guarantee_split import job, moves
from tests.unit.scheduler.test_shape_lanes import gangs_on_a_fragmented_pool, lanes_open

Quotas = dict[str, tuple[str, dict[str, tuple[int, int | None]]]]
"""team -> (cohort, pool -> (nominal, borrowing limit))."""


def fleet(config: SchedulerConfig, nodes: dict[str, list[str]], quotas: Quotas, capacity: dict[str, int],
          running: list[tuple[str, str, str, list[int]]]) -> SchedulingState:  # fmt: skip
    """4-GPU nodes by pool, quotas, and running jobs (team, node, class, GPU indices), each placed where given."""
    state = SchedulingState(config)
    for pool, names in nodes.items():
        for name in names:
            state.index.add_node(name, pool=pool, model="H100", rack="r", zone="z", capacity=4, free=range(4))
    teams = [
        TeamConfig(name=t, org="org", cohort=cohort, quotas=[
            TeamQuota(pool=p, nominal=n, borrowing_limit=limit) for p, (n, limit) in by_pool.items()
        ])
        for t, (cohort, by_pool) in quotas.items()
    ]  # fmt: skip
    config_ = QuotaConfig(pools=[PoolConfig(name=p, gpu_model="H100") for p in nodes], orgs=[OrgConfig(name="org")],
                          teams=teams)  # fmt: skip
    state.set_quota(validate(config_, capacity=capacity))
    for i, (team, node, cls, gpus) in enumerate(running):
        pending = job(f"{team}{i}", (team, cls, len(gpus), None, None), 0.0)
        state.place(pending, tuple(GpuRef(node, g) for g in gpus), "running", 0.0, borrowing=False)
    state.mark_borrowed()
    return state


def same_with_lanes_open(build: Callable[[], SchedulingState]) -> list[Decision]:
    """A cycle on `build()`, checked to place, preempt and nominate as it does with no lane ever closed (on the
    pure-Python core: compiled, `lanes_open` cannot open them, see `tests.support.core`)."""
    closing = build().cycle(100.0)
    if not COMPILED:
        with lanes_open():
            assert moves([build().cycle(100.0)]) == moves([closing])
    return closing


def gpu_room_freed_by_a_reservation_moved_elsewhere() -> SchedulingState:
    """Pool pa: n0, n1, each with 3 one-GPU jobs of x; pool pb: m0, m1, each with 2 of y. g's 4-GPU train job (any
    pool) is reserved in pa; a's 2-GPU job is refused (no borrowing), no 2-GPU gang fits pa's free GPUs, and the
    reservation is made. After the walk g is given room in pb instead (moving y's jobs), which frees what its
    reservation held in pa: b's 2-GPU job, looked at in full in the walk, is given room there."""
    state = fleet(
        SchedulerConfig(max_reservations=1), {"pa": ["n0", "n1"], "pb": ["m0", "m1"]},
        {"g": ("cg", {"pa": (4, None), "pb": (4, None)}), "x": ("cx", {"pa": (6, None)}),
         "y": ("cy", {"pb": (4, None)}), "a": ("c1", {"pa": (0, 0)}), "b": ("c1", {"pa": (0, None)})},
        {"pa": 14, "pb": 8},
        [("x", n, "research", [i]) for n in ("n0", "n1") for i in range(3)]
        + [("y", m, "research", [i]) for m in ("m0", "m1") for i in range(2)],
    )  # fmt: skip
    state.add(job("R", ("g", "train", 4, None, None), 10.0))
    state.add(job("A", ("a", "research", 2, "pa", None), 11.0))
    state.add(job("B", ("b", "research", 2, "pa", None), 12.0))
    return state


def test_a_gang_whose_room_a_moved_reservation_frees_is_still_given_it() -> None:
    """Found by review: the lane closed after a's job (pa had fewer GPUs free than the shape asks for), and b's job
    never joined the consolidation list."""
    decisions = same_with_lanes_open(gpu_room_freed_by_a_reservation_moved_elsewhere)
    assert "B" in [d.job_id for d in decisions if isinstance(d, Nominate)]


def a_tail_head_that_came_too_late() -> SchedulingState:
    """pa: n0-n2, each with 3 one-GPU jobs of x (3 GPUs free); pb as above. g's job is reserved in pa; b0's 2-GPU
    job blocks the shape, a's (no borrowing) is found hopeless and closes the lane with b2's in its rest; c's
    one-GPU job then takes a GPU, so when b2's turn would have come too few were free to open room for it. After
    the walk g goes to pb, freeing its reservation's GPUs: b2's, never listed, must not be given room."""
    state = fleet(
        SchedulerConfig(max_reservations=1), {"pa": ["n0", "n1", "n2"], "pb": ["m0", "m1"]},
        {"g": ("cg", {"pa": (4, None), "pb": (4, None)}), "x": ("cx", {"pa": (9, None)}),
         "y": ("cy", {"pb": (4, None)}), "l1": ("c1", {"pa": (2, None)}), "l2": ("c2", {"pa": (2, None)}),
         "b0": ("c1", {"pa": (0, None)}), "c": ("c1", {"pa": (0, None)}), "a": ("c1", {"pa": (0, 0)}),
         "b2": ("c2", {"pa": (0, None)})},
        {"pa": 17, "pb": 8},
        [("x", n, "research", [i]) for n in ("n0", "n1", "n2") for i in range(3)]
        + [("y", m, "research", [i]) for m in ("m0", "m1") for i in range(2)],
    )  # fmt: skip
    for i, (name, team, gpus) in enumerate((("R", "g", 4), ("B0", "b0", 2), ("B1", "a", 2), ("C", "c", 1),
                                             ("B2", "b2", 2))):  # fmt: skip
        state.add(job(name, (team, "train" if name == "R" else "research", gpus, None if name == "R" else "pa",
                             None), 10.0 + i))  # fmt: skip
    return state


def test_a_closed_lanes_head_whose_turn_came_with_too_few_gpus_free_is_not_given_room() -> None:
    decisions = same_with_lanes_open(a_tail_head_that_came_too_late)
    assert "B2" not in [d.job_id for d in decisions if isinstance(d, Nominate)]


def a_sticky_reservation_out_of_order() -> SchedulingState:
    """Sticky reservations: H2 (behind H1 in q's sub-queue) held a reservation, so once H1 is placed H2 is taken
    out of queue order, after L's turn and before T's. The closed lane's rest (T) goes before H2 in the list of
    jobs room is opened for, as the walk would have taken them."""
    state = fleet(
        SchedulerConfig(max_reservations=1, sticky_reservations="all"), {"default": [f"n{i}" for i in range(6)]},
        {"x": ("cx", {"default": (18, None)}), "g": ("cg", {"default": (3, None)}),
         "l1": ("c1", {"default": (5, None)}), "l2": ("c2", {"default": (4, None)}),
         "b0": ("c1", {"default": (0, None)}), "a": ("c1", {"default": (0, 0)}), "q": ("c1", {"default": (0, None)}),
         "t": ("c2", {"default": (0, None)})},
        {"default": 30},
        [("x", "n0", "research", [0, 1, 2, 3]), ("x", "n1", "research", [0]), ("x", "n1", "research", [1])]
        + [("x", f"n{n}", "research", [i]) for n in range(2, 6) for i in range(3)],
    )  # fmt: skip
    for i, (name, team, cls, gpus) in enumerate((("R", "g", "best-effort", 3), ("L0", "b0", "research", 4),
                                                  ("L", "a", "research", 4), ("T", "t", "research", 4),
                                                  ("H1", "q", "research", 2), ("H2", "q", "research", 2))):  # fmt: skip
        state.add(job(name, (team, cls, gpus, None, None), 10.0 + i))
    state.queue.reserved = {"H2": (GpuRef("n1", 2), GpuRef("n1", 3))}
    return state


def test_a_job_taken_out_of_queue_order_keeps_its_place_in_the_consolidation_list() -> None:
    """Found by review: the list was merged with the closed lane's rest by queue order, so H2 (taken out of
    order, after L) was tried before T, and room was opened for H2 instead of T."""
    same_with_lanes_open(a_sticky_reservation_out_of_order)


def test_a_gang_of_a_team_whose_budget_blocks_it_is_not_given_room() -> None:
    """Found by review (before the lanes): a gang passed by as hopeless joined the consolidation list without its
    team's budget being asked, and room was opened for it."""
    state = gangs_on_a_fragmented_pool()
    state.budget_blocks = {"b": "block-all"}
    nominated = [d.job_id for d in state.cycle(100.0) if isinstance(d, Nominate)]
    assert "b1" not in nominated
    assert nominated == ["a1", "c1"]


def test_a_closed_lanes_heads_the_test_budget_never_reached_are_not_given_room() -> None:
    """Found by review: with a budget of two looks, a is looked at and b found hopeless (closing the lane with c in
    its rest), and the walk ends there; room was then opened for c too, whose turn never came."""

    def two_looks() -> SchedulingState:
        state = gangs_on_a_fragmented_pool()
        state.config = replace(state.config, max_tests_per_cycle=2)
        return state

    decisions = same_with_lanes_open(two_looks)
    assert [d.job_id for d in decisions if isinstance(d, Nominate)] == ["a1", "b1"]


def a_gang_lane_with_no_room_left() -> SchedulingState:
    """pa: n0 with 2 one-GPU jobs of x, n1 and n2 with 3; pb: m0, m1 with 2 of y each. g's job is reserved on n0
    (holding its 2 free GPUs; pa keeps 2 free). a's 3-GPU job is refused (no borrowing): fewer GPUs are free in pa
    than the shape asks for. Looked at in full, t1's 3-GPU job is admitted, blocks the shape and joins the list
    room is opened for; t2's is then found hopeless with too few GPUs free, and does not. u (t1's one-GPU job)
    takes t1 to its borrowing limit. After the walk g goes to pb, freeing n0: t1's job is refused there, and
    t2's was never listed."""
    state = fleet(
        SchedulerConfig(max_reservations=1), {"pa": ["n0", "n1", "n2"], "pb": ["m0", "m1"]},
        {"g": ("cg", {"pa": (4, None), "pb": (4, None)}), "x": ("cx", {"pa": (8, None)}),
         "y": ("cy", {"pb": (4, None)}), "a": ("c1", {"pa": (0, 0)}), "t1": ("c1", {"pa": (0, 3)}),
         "t2": ("c2", {"pa": (0, None)}), "l1": ("c1", {"pa": (4, None)}), "l2": ("c2", {"pa": (3, None)})},
        {"pa": 20, "pb": 8},
        [("x", "n0", "research", [0]), ("x", "n0", "research", [1])]
        + [("x", n, "research", [i]) for n in ("n1", "n2") for i in range(3)]
        + [("y", m, "research", [i]) for m in ("m0", "m1") for i in range(2)],
    )  # fmt: skip
    for i, (name, team, cls, gpus, pool) in enumerate((("R", "g", "train", 4, None), ("A", "a", "research", 3, "pa"),
                                                        ("T1", "t1", "research", 3, "pa"),
                                                        ("T2", "t2", "research", 3, "pa"),
                                                        ("U", "t1", "best-effort", 1, "pa"))):  # fmt: skip
        state.add(job(name, (team, cls, gpus, pool, None), 10.0 + i))
    return state


def test_a_gang_lane_with_no_room_left_stays_open() -> None:
    """Found by the second review: the lane was closed after a's job with its rest listed until the shape was found
    blocked, which in the closed lane it never was (t1's head would have blocked it), so t2's was given room."""
    decisions = same_with_lanes_open(a_gang_lane_with_no_room_left)
    assert "T2" not in [d.job_id for d in decisions if isinstance(d, Nominate)]


def around_the_reviews(r: random.Random) -> tuple[SchedulingState, list[PendingJob], list[str], int]:
    """A random neighbour of the two-pool cases above (after the third review's fuzzer, which ran 50,000 without a
    difference; put back, the second review's bug fails this test in every run, the missing cutoff in about one
    run in three at this budget: the cases above pin each bug): pa's nodes with 2-3 small jobs of x each, pb's
    with 1-3 of y, g's 4-GPU reservation holder that may be given room in pb, borrow-only teams with 1-3-GPU
    jobs in pa (some with borrowing limits), lenders, a budget block, sticky reservations. Returns the state,
    the jobs in submit order, running jobs that end before the third round, and how many jobs the first round
    has."""
    npa = r.choice([2, 3, 3, 3, 4])
    per = [r.choice([2, 3, 3, 3]) for _ in range(npa)]
    pbn = [r.choice([1, 2, 2, 3]) for _ in range(2)]
    config = SchedulerConfig(max_reservations=r.choice([1, 1, 1, 2]),
                             sticky_reservations=r.choice(["none", "none", "all"]))  # fmt: skip
    quotas: Quotas = {
        "g": ("cg", {"pa": (4, None), "pb": (4, None)}), "x": ("cx", {"pa": (sum(per), None)}),
        "y": ("cy", {"pb": (sum(pbn), None)}), "l1": ("c1", {"pa": (r.randint(1, 3), None)}),
        "l2": ("c2", {"pa": (r.randint(1, 3), None)}),
    }  # fmt: skip
    for team in ("b0", "a", "c", "b2", "d"):
        quotas[team] = (r.choice(["c1", "c2"]), {"pa": (0, r.choice([None, None, None, 0, 1, 2]))})
    canon = r.random() < 0.6  # the layout of `a_tail_head_that_came_too_late`, cohorts drawn
    if canon:
        c1, c2 = r.sample(["c1", "c2"], 2)
        quotas.update(b0=(c1, {"pa": (0, None)}), c=(c1, {"pa": (0, None)}), a=(r.choice([c1, c2]), {"pa": (0, 0)}),
                      b2=(c2, {"pa": (0, None)}))  # fmt: skip
    lent = quotas["l1"][1]["pa"][0] + quotas["l2"][1]["pa"][0]
    capacity = {"pa": sum(per) + 4 + lent + r.choice([0, 0, 1]), "pb": sum(pbn) + 4}
    running = [("x", f"n{n}", r.choice(["research"] * 8 + ["train"]), [i]) for n in range(npa)
               for i in r.sample(range(4), per[n])]  # fmt: skip
    running += [("y", f"m{m}", "research", [i]) for m in range(2) for i in r.sample(range(4), pbn[m])]
    state = fleet(config, {"pa": [f"n{i}" for i in range(npa)], "pb": ["m0", "m1"]}, quotas, capacity, running)
    if r.random() < 0.15:
        state.budget_blocks = {r.choice(["b0", "b2", "d"]): "block-all"}
    specs = [("B0", "b0", "research", 2, "pa"), ("A", "a", "research", 2, "pa"), ("C", "c", "research", 1, "pa"),
             ("B2", "b2", "research", 2, "pa"),
             ("D", "d", r.choice(["research", "best-effort"]), r.choice([1, 2, 3]), r.choice(["pa", None])),
             ]  # fmt: skip
    for k in range(r.randint(0, 3)):
        specs.append(
            (
                f"E{k}",
                r.choice(["b0", "a", "c", "b2", "d", "l1", "l2"]),
                r.choice(["research", "research", "best-effort"]),
                r.choice([1, 2, 2]),
                r.choice(["pa", None]),
            )
        )
    if canon and r.random() < 0.7:  # b0, a, c, b2 in that order, the others anywhere among them
        core = specs[:4]
        for extra in specs[4:]:
            core.insert(r.randint(0, len(core)), extra)
        specs = core
    else:
        r.shuffle(specs)
    specs.insert(0, ("R", "g", "train", 4, None))
    queued = [job(name, (team, cls, gpus, pool, None), 10.0 + i) for i, (name, team, cls, gpus, pool) in
              enumerate(specs)]  # fmt: skip
    ids = list(state.running)
    ending = [ids[i] for i in r.sample(range(len(ids)), r.randint(0, 2))]
    return state, queued, ending, r.randint(2, len(queued))


def rounds(case: tuple[SchedulingState, list[PendingJob], list[str], int]) -> list[list[Decision]]:
    state, queued, ending, first = case
    for pending in queued[:first]:
        state.add(pending)
    out = [state.decide(100.0)]
    for pending in queued[first:]:
        state.add(pending)
    out.append(state.decide(110.0))
    for job_id in ending:
        if job_id in state.running:
            state.release(job_id)
    out.append(state.decide(200.0))
    return moves(out)


@pure_core_only
@settings(max_examples=1000, deadline=None)
@given(st.randoms(use_true_random=False))
def test_closing_lanes_around_the_reviewed_cases_changes_no_decision(r: random.Random) -> None:
    seed = r.getrandbits(64)
    closing = rounds(around_the_reviews(random.Random(seed)))
    with lanes_open():
        assert rounds(around_the_reviews(random.Random(seed))) == closing
