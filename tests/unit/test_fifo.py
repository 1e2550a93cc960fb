"""FIFO first-fit placement: scenario table plus property tests of the placement invariants."""

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import JobRecord, Node
from chamber.scheduler.core.fifo import Place, Wait, decide
from chamber.scheduler.core.fleet import build_fleet
from tests.support.builders import make_job, make_node


@dataclass
class Scenario:
    name: str
    nodes: list[Node]
    jobs: list[JobRecord]
    placed: dict[str, list[tuple[str, int]]]
    """job -> GPUs expected; jobs not listed must wait."""
    cordoned: set[str] = field(default_factory=set)
    owners: dict[str, str] = field(default_factory=dict)


TWO_NODES = [make_node("n1").gpus(4).build(), make_node("n2").gpus(4).build()]

SCENARIOS = [
    Scenario(
        "one job takes the first free GPUs", TWO_NODES, [make_job("a").gpus(2).build()], {"a": [("n1", 0), ("n1", 1)]}
    ),
    Scenario(
        "a gang's replicas go where each fits",
        TWO_NODES,
        [make_job("a").gpus(4, replicas=2).build()],
        {"a": [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3), ("n2", 0), ("n2", 1), ("n2", 2), ("n2", 3)]},
    ),
    Scenario("a gang that cannot fit whole takes nothing", TWO_NODES, [make_job("a").gpus(4, replicas=3).build()], {}),
    Scenario(
        "a replica never spans nodes",
        TWO_NODES,
        [make_job("a").gpus(3).at(0).build(), make_job("b").gpus(3).at(1).build(), make_job("c").gpus(2).at(2).build()],
        {"a": [("n1", 0), ("n1", 1), ("n1", 2)], "b": [("n2", 0), ("n2", 1), ("n2", 2)]},
    ),
    Scenario(
        "cordoned GPUs are never used",
        TWO_NODES,
        [make_job("a").gpus(4).build()],
        {"a": [("n2", 0), ("n2", 1), ("n2", 2), ("n2", 3)]},
        cordoned={"n1/0"},
    ),
    Scenario(
        "claimed GPUs are never used",
        TWO_NODES,
        [make_job("a").gpus(2).build()],
        {"a": [("n1", 2), ("n1", 3)]},
        owners={"n1/0": "x/1", "n1/1": "x/1"},
    ),
    Scenario(
        "higher priority goes first",
        [make_node("n1").gpus(2).build()],
        [make_job("low").gpus(2).priority("research").at(0).build(), make_job("high").gpus(2).at(5).build()],
        {"high": [("n1", 0), ("n1", 1)]},
    ),
    Scenario(
        "the queue head blocks later jobs (strict FIFO)",
        [make_node("n1").gpus(2).build()],
        [make_job("big").gpus(2, replicas=2).at(0).build(), make_job("small").gpus(1).at(1).build()],
        {},
    ),
    Scenario(
        "running jobs are not placed again",
        TWO_NODES,
        [make_job("r").running_on(("n1", 0)).build()],
        {},
        owners={"n1/0": "r/1"},
    ),
    Scenario(
        "a pool constraint is honoured",
        [make_node("n1").gpus(2).build(), make_node("n2").gpus(2).pool("b").build()],
        [make_job("a").gpus(1).pool("b").build()],
        {"a": [("n2", 0)]},
    ),
]


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(sc: Scenario) -> None:
    fleet = build_fleet(sc.nodes, sc.owners, dict.fromkeys(sc.cordoned, "bad"))
    decisions = decide(fleet, sc.jobs)
    placed = {d.job_id: [(g.node, g.index) for g in d.gpus] for d in decisions if isinstance(d, Place)}
    assert placed == sc.placed
    waiting = {d.job_id for d in decisions if isinstance(d, Wait)}
    expected_waiting = {j.id for j in sc.jobs if j.placement is None} - set(sc.placed)
    assert waiting == expected_waiting


@st.composite
def fleets_and_jobs(draw: st.DrawFn) -> tuple[list[Node], list[JobRecord], set[str], dict[str, str]]:
    n_nodes = draw(st.integers(1, 6))
    nodes = [make_node(f"n{i}").gpus(draw(st.sampled_from([2, 4, 8]))).build() for i in range(n_nodes)]
    slots = [f"{n.name}/{g.index}" for n in nodes for g in n.gpus]
    cordoned = set(draw(st.lists(st.sampled_from(slots), max_size=4)))
    owners = dict.fromkeys(draw(st.lists(st.sampled_from(slots), max_size=8)), "other/1")
    jobs = [
        make_job(f"j{i}")
        .gpus(draw(st.sampled_from([1, 2, 4, 8])), replicas=draw(st.integers(1, 3)))
        .priority(draw(st.sampled_from(["train", "research", "best-effort"])))
        .at(float(i))
        .build()
        for i in range(draw(st.integers(0, 12)))
    ]
    return nodes, jobs, cordoned, owners


@settings(max_examples=200, deadline=None)
@given(fleets_and_jobs())
def test_placement_invariants(case: tuple[list[Node], list[JobRecord], set[str], dict[str, str]]) -> None:
    nodes, jobs, cordoned, owners = case
    fleet = build_fleet(nodes, owners, dict.fromkeys(cordoned, "bad"))
    by_id = {j.id: j for j in jobs}
    used: set[str] = set()
    for d in decide(fleet, jobs):
        if not isinstance(d, Place):
            continue
        spec = by_id[d.job_id].spec
        slots = [g.slot for g in d.gpus]
        assert len(slots) == spec.gpus, "a gang gets all its GPUs or none"
        assert not used & set(slots), "no GPU is given to two jobs"
        assert not set(slots) & cordoned, "no placement on unschedulable GPUs"
        assert not set(slots) & set(owners), "no placement on claimed GPUs"
        used |= set(slots)
        for r in range(spec.replicas):
            replica = d.gpus[r * spec.gpus_per_replica : (r + 1) * spec.gpus_per_replica]
            assert len({g.node for g in replica}) == 1, "each replica sits on one node"
