"""The scheduling cycle, rule by rule, as a table of named scenarios (fleet, jobs, expected decisions)."""

from dataclasses import dataclass, field

import msgspec
import pytest

from chamber.common.contracts import Cordon, JobRecord, Node
from chamber.scheduler.core.decisions import Nominate, Place, Preempt, Wait
from chamber.scheduler.core.estimates import RuntimePredictor
from chamber.scheduler.core.reasons import Reason, WaitKind
from chamber.scheduler.core.state import SchedulerConfig, SchedulingState
from tests.support.builders import degraded, fatal, make_job, make_node

NOW = 1000.0


@dataclass
class Scenario:
    name: str
    nodes: list[Node]
    jobs: list[JobRecord]
    placed: dict[str, set[str] | list[tuple[str, int]]] = field(default_factory=dict)
    """job -> the nodes it lands on, or its exact GPUs."""
    preempted: set[str] = field(default_factory=set)
    nominated: set[str] = field(default_factory=set)
    waiting: dict[str, str] = field(default_factory=dict)
    """job -> a phrase its reason must contain."""
    cordoned: dict[str, Cordon] = field(default_factory=dict)
    standing: dict[str, float] = field(default_factory=dict)
    borrowed: frozenset[str] = frozenset()
    grace: dict[str, float] = field(default_factory=dict)
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    history: list[tuple[str, str, int, float]] = field(default_factory=list)
    """Finished jobs the runtime predictor has seen: (team, name, GPUs, run seconds)."""


EASY = SchedulerConfig(max_reservations=1)
"""Classic EASY backfill: one reservation, for the first blocked head."""


def n8(name: str, rack: str = "rack-0") -> Node:
    return make_node(name).gpus(8).rack(rack).build()


def holding(job: str, node: str, count: int, start: int = 0) -> tuple[tuple[str, int], ...]:
    return tuple((node, i) for i in range(start, start + count))


J = make_job


def fragmented() -> list[JobRecord]:
    """2 GPUs free on a (next to a 4-GPU job and two 1-GPU jobs) and 2 on b (next to a 6-GPU job); a 4-GPU job
    waits. All preemptible (`research`), all of one priority."""
    return [
        J("r1").gpus(4).priority("research").running_on(*holding("r1", "a", 4)).started_at(NOW - 600).build(),
        J("s1").gpus(1).priority("research").running_on(("a", 4)).started_at(NOW - 600).build(),
        J("s2").gpus(1).priority("research").running_on(("a", 5)).started_at(NOW - 600).build(),
        J("r2").gpus(6).priority("research").running_on(*holding("r2", "b", 6)).started_at(NOW - 600).build(),
        J("wide").gpus(4).priority("research").at(0).build(),
    ]


def two_gangs_behind_two_nodes() -> list[JobRecord]:
    """a is busy for 40 more minutes, half of b for 100; two 8-GPU gangs and a 4-GPU job wait."""
    return [
        J("r1").running_on(*holding("r1", "a", 8)).estimate(3600).started_at(NOW - 1200).build(),
        J("r2").running_on(*holding("r2", "b", 4)).estimate(7200).started_at(NOW - 1200).build(),
        J("h1").gpus(8).at(0).build(),
        J("h2").gpus(8).at(1).build(),
        J("small").gpus(4).at(2).build(),
    ]


SCENARIOS = [
    # ---- packing and topology
    Scenario(
        "best fit: a small job goes to the fullest node that holds it",
        [n8("a"), n8("b")],
        [J("r").running_on(*holding("r", "a", 5)).build(), J("x").gpus(2).build()],
        placed={"x": [("a", 5), ("a", 6)]},
    ),
    Scenario(
        "small jobs share one node and leave whole nodes free",
        [n8("a"), n8("b")],
        [J(f"s{i}").gpus(1).at(i).build() for i in range(4)],
        placed={f"s{i}": {"a"} for i in range(4)},
    ),
    Scenario(
        "a gang's replicas fill whole nodes",
        [n8("a"), n8("b"), n8("c")],
        [J("g").gpus(8, replicas=2).build()],
        placed={"g": {"a", "b"}},
    ),
    Scenario(
        "a gang that cannot fit whole takes nothing",
        [n8("a"), n8("b"), n8("c")],
        [J("r").priority("train").running_on(*holding("r", "c", 1)).build(), J("g").gpus(8, replicas=3).build()],
        waiting={"g": "waiting for 24 GPUs"},
    ),
    Scenario(
        "a gang larger than the whole fleet is unschedulable, and says why",
        [n8("a"), n8("b")],
        [J("g").gpus(8, replicas=3).build()],
        waiting={"g": "unschedulable: 24 GPUs (3 x 8) needs more nodes than the fleet has"},
    ),
    Scenario(
        "a job for a pool that has no nodes is unschedulable, and says which",
        [n8("a")],
        [J("x").gpus(1).pool("spot").build()],
        waiting={"x": "unschedulable: no nodes with GPUs of spot"},
    ),
    Scenario(
        "same-node keeps all replicas on one node",
        [make_node("a").gpus(4).build(), n8("b")],
        [J("g").gpus(2, replicas=3).topology("node").build()],
        placed={"g": {"b"}},
    ),
    Scenario(
        "same-rack picks the rack that fits the gang most tightly",
        [n8("a1", "r1"), n8("a2", "r1"), n8("a3", "r1"), n8("b1", "r2"), n8("b2", "r2")],
        [J("g").gpus(8, replicas=2).topology("rack").build()],
        placed={"g": {"b1", "b2"}},
    ),
    Scenario(
        "a required rack waits even when the fleet has room",
        [n8("a1", "r1"), n8("b1", "r2")],
        [J("g").gpus(8, replicas=2).topology("rack").build()],
        waiting={"g": "in one rack"},
    ),
    Scenario(
        "a preferred rack falls back to anywhere",
        [n8("a1", "r1"), n8("b1", "r2")],
        [J("g").gpus(8, replicas=2).topology("rack", required=False).build()],
        placed={"g": {"a1", "b1"}},
    ),
    Scenario(
        "a pool constraint is honoured",
        [n8("a"), make_node("b").gpus(8).pool("spot").build()],
        [J("x").gpus(1).pool("spot").build()],
        placed={"x": {"b"}},
    ),
    Scenario(
        "a GPU model constraint is honoured",
        [n8("a"), make_node("b").gpus(8).model_name("A100").build()],
        [J("x").gpus(1).gpu_model("A100").build()],
        placed={"x": {"b"}},
    ),
    Scenario(
        "unschedulable GPUs are never used",
        [make_node("a").gpus(2).build()],
        [J("x").gpus(2).build()],
        cordoned={"a/1": fatal("XID 79")},
        waiting={"x": "waiting for 2 GPUs; 1 free"},
    ),
    # ---- order
    Scenario(
        "higher priority goes first",
        [make_node("a").gpus(2).build()],
        [J("low").gpus(2).priority("best-effort").at(0).build(), J("high").gpus(2).priority("inference").at(5).build()],
        placed={"high": {"a"}},
        waiting={"low": "waiting"},
    ),
    Scenario(
        "within a class, the team with more fair-share standing goes first",
        [make_node("a").gpus(2).build()],
        [J("x").team("rich").gpus(2).at(0).build(), J("y").team("poor").gpus(2).at(5).build()],
        standing={"poor": 1.0, "rich": -1.0},
        placed={"y": {"a"}},
    ),
    Scenario(
        "a job preempted before keeps its place and gains standing in its class",
        [make_node("a").gpus(2).build()],
        [
            J("fresh").gpus(2).priority("research").at(0).build(),
            J("victim").gpus(2).priority("research").at(10).preempted(2).build(),
        ],
        placed={"victim": {"a"}},
    ),
    # ---- backfill
    Scenario(
        "EASY: the blocked head gets a reservation with its earliest start",
        [n8("a"), n8("b")],
        [
            J("r").running_on(*holding("r", "a", 8)).estimate(3600).started_at(NOW - 1200).build(),
            J("head").gpus(8, replicas=2).at(0).build(),
        ],
        waiting={"head": "reserved, earliest start in 40 min"},
        config=EASY,
    ),
    Scenario(
        "EASY: a short job backfills into reserved capacity, a long one does not",
        [n8("a"), n8("b")],
        [
            J("r").running_on(*holding("r", "a", 8)).estimate(3600).started_at(NOW - 1200).build(),
            J("head").gpus(8, replicas=2).at(0).build(),
            J("long").gpus(4).estimate(7200).at(1).build(),
            J("short").gpus(4).estimate(600).at(2).build(),
        ],
        placed={"short": {"b"}},
        waiting={"head": "reserved", "long": "reserved for jobs ahead (head"},
        config=EASY,
    ),
    Scenario(
        "EASY: a job without an estimate only uses capacity the reservation does not need",
        [n8("a"), n8("b"), make_node("c").gpus(4).build()],
        [
            J("r").running_on(*holding("r", "a", 8)).estimate(3600).build(),
            J("head").gpus(8, replicas=2).at(0).build(),
            J("open").gpus(4).at(1).build(),
            J("open2").gpus(4).at(2).build(),
        ],
        placed={"open": {"c"}},
        waiting={"head": "reserved", "open2": "reserved for jobs ahead (head"},
        config=EASY,
    ),
    Scenario(
        "several reservations: the second blocked gang drains another node instead of waiting for the same one",
        [n8("a"), n8("b")],
        two_gangs_behind_two_nodes(),
        waiting={"h1": "earliest start in 40 min", "h2": "earliest start in 1.7 h", "small": "reserved for"},
        config=SchedulerConfig(max_reservations=2),
    ),
    Scenario(
        "classic EASY reserves for the first gang only: the free half of b goes to a small job",
        [n8("a"), n8("b")],
        two_gangs_behind_two_nodes(),
        placed={"small": {"b"}},
        waiting={"h1": "earliest start in 40 min"},
        config=EASY,
    ),
    # ---- order policy: shortest predicted first, least attained service, age protection
    Scenario(
        "spf: of two jobs of one team and shape, the one predicted shorter (from the team's history) goes first",
        [make_node("a").gpus(1).build()],
        [J("long").named("pretrain").at(0).build(), J("short").named("eval").at(1).build()],
        placed={"short": {"a"}},
        waiting={"long": "waiting"},
        history=[("team-a", "pretrain", 1, 36000.0), ("team-a", "eval", 1, 600.0)],
    ),
    Scenario(
        "fifo order: the same two jobs in submit order",
        [make_node("a").gpus(1).build()],
        [J("long").named("pretrain").at(0).build(), J("short").named("eval").at(1).build()],
        placed={"long": {"a"}},
        history=[("team-a", "pretrain", 1, 36000.0), ("team-a", "eval", 1, 600.0)],
        config=SchedulerConfig(order="fifo"),
    ),
    Scenario(
        "spf: a job waiting longer than max_wait_s is aged: it goes first however long it is predicted to run",
        [make_node("a").gpus(1).build()],
        [J("long").named("pretrain").at(NOW - 90_000).build(), J("short").named("eval").at(1).build()],
        placed={"long": {"a"}},
        history=[("team-a", "pretrain", 1, 36000.0), ("team-a", "eval", 1, 600.0)],
        config=SchedulerConfig(order="spf", max_wait_s=86_400),
    ),
    Scenario(
        "spf: an aged job of a lower fair-share standing still goes ahead of a team with a better standing",
        [make_node("a").gpus(1).build()],
        [
            J("old").team("rich").at(NOW - 90_000).build(),
            J("new").team("poor").at(1).build(),
        ],
        placed={"old": {"a"}},
        standing={"rich": -1.0, "poor": 1.0},
    ),
    Scenario(
        "las: a job that already ran (preempted, requeued) waits behind one that has not run at all",
        [make_node("a").gpus(1).build()],
        [J("ran").at(0).preempted(1).ran(3600).build(), J("fresh").at(1).build()],
        placed={"fresh": {"a"}},
        config=SchedulerConfig(order="las", standing_cap=0),
    ),
    Scenario(
        "backfill with a predicted runtime: a job without a user estimate, predicted short, uses reserved GPUs",
        [n8("a"), n8("b")],
        [
            J("r").running_on(*holding("r", "a", 8)).estimate(3600).started_at(NOW - 1200).build(),
            J("head").gpus(8, replicas=2).at(0).build(),
            J("quick").named("eval").gpus(4).at(1).build(),
        ],
        placed={"quick": {"b"}},
        waiting={"head": "reserved"},
        history=[("team-a", "eval", 4, 300.0)],
        config=SchedulerConfig(order="fifo", backfill_on_predictions=True),  # the head first, whatever its rank
    ),
    Scenario(
        "backfill on users' estimates only (backfill_on_predictions off): the same job, predicted short, does not "
        "use them",
        [n8("a"), n8("b")],
        [
            J("r").running_on(*holding("r", "a", 8)).estimate(3600).started_at(NOW - 1200).build(),
            J("head").gpus(8, replicas=2).at(0).build(),
            J("quick").named("eval").gpus(4).at(1).build(),
        ],
        waiting={"head": "reserved", "quick": "reserved for jobs ahead (head"},
        history=[("team-a", "eval", 4, 300.0)],
        config=SchedulerConfig(order="fifo", backfill_on_predictions=False),
    ),
    Scenario(
        "a head blocked by jobs without estimates still holds its capacity",
        [n8("a"), n8("b")],
        [
            J("r").running_on(*holding("r", "a", 8)).build(),
            J("head").gpus(8, replicas=2).at(0).build(),
            J("small").gpus(1).estimate(10).at(1).build(),
        ],
        waiting={"head": "earliest start unknown", "small": "reserved for jobs ahead (head"},
        config=EASY,
    ),
    # ---- consolidation
    Scenario(
        "consolidation: 4 GPUs are free but on no one node; two one-GPU jobs move to open a node for a 4-GPU job",
        [n8("a"), n8("b")],
        fragmented(),
        preempted={"s1", "s2"},
        nominated={"wide"},
    ),
    Scenario(
        "consolidation comes after the walk: a one-GPU job behind takes a free GPU first, then too few are free",
        [n8("a"), n8("b")],
        [*fragmented(), J("one").gpus(1).priority("research").at(1).build()],
        placed={"one": {"a"}},
        waiting={"wide": "waiting for 4 GPUs"},
    ),
    Scenario(
        "consolidation moves a job only if it has a place elsewhere now",
        [n8("a"), n8("b"), n8("c")],
        [
            J("big").gpus(4).priority("research").running_on(*holding("big", "a", 4)).build(),
            J("s").gpus(2).priority("research").running_on(*holding("s", "a", 2, start=4)).build(),
            J("r2").gpus(7).priority("research").running_on(*holding("r2", "b", 7)).build(),
            J("r3").gpus(7).priority("research").running_on(*holding("r3", "c", 7)).build(),
            J("wide").gpus(4).priority("research").at(0).build(),
        ],
        waiting={"wide": "waiting for 4 GPUs"},
    ),
    Scenario(
        "consolidation never moves a job as large as the one it makes room for, nor a non-preemptible one (train)",
        [n8("a"), n8("b")],
        [
            J("r1").gpus(4).priority("train").running_on(*holding("r1", "a", 4)).build(),
            J("s1").gpus(1).priority("train").running_on(("a", 4)).build(),
            J("s2").gpus(1).priority("train").running_on(("a", 5)).build(),
            J("r2").gpus(6).priority("train").running_on(*holding("r2", "b", 6)).build(),
            J("wide").gpus(4).priority("train").at(0).build(),
        ],
        waiting={"wide": "waiting for 4 GPUs"},
    ),
    Scenario(
        "consolidation off: the 4-GPU job waits on the fragmented fleet",
        [n8("a"), n8("b")],
        fragmented(),
        waiting={"wide": "waiting for 4 GPUs"},
        config=SchedulerConfig(consolidate=False),
    ),
    # ---- preemption
    Scenario(
        "a higher-priority job preempts lower-priority work and is nominated its GPUs",
        [n8("a")],
        [
            J("low").priority("research").running_on(*holding("low", "a", 8)).grace_s(30).build(),
            J("hi").gpus(8).priority("train").build(),
        ],
        preempted={"low"},
        nominated={"hi"},
        grace={"low": 30},
    ),
    Scenario(
        "non-preemptible work is never preempted",
        [n8("a")],
        [
            J("t").priority("train").running_on(*holding("t", "a", 8)).build(),
            J("i").gpus(8).priority("inference").build(),
        ],
        waiting={"i": "waiting"},
    ),
    Scenario(
        "equal priority never preempts (no ping-pong)",
        [n8("a")],
        [
            J("r1").priority("research").running_on(*holding("r1", "a", 8)).build(),
            J("r2").gpus(8).priority("research").preempted(3).build(),
        ],
        waiting={"r2": "waiting"},
    ),
    Scenario(
        "a job within its minimum runtime is not preempted",
        [n8("a")],
        [
            J("low")
            .priority("research")
            .running_on(*holding("low", "a", 8))
            .started_at(NOW - 10)
            .min_runtime_s(60)
            .build(),
            J("hi").gpus(8).priority("train").build(),
        ],
        waiting={"hi": "waiting"},
    ),
    Scenario(
        "the cheapest victim: lowest priority first",
        [make_node("a").gpus(4).build(), make_node("b").gpus(4).build()],
        [
            J("res").priority("research").running_on(*holding("res", "a", 4)).build(),
            J("be").priority("best-effort").running_on(*holding("be", "b", 4)).build(),
            J("hi").gpus(4).priority("train").build(),
        ],
        preempted={"be"},
        nominated={"hi"},
    ),
    Scenario(
        "the cheapest victim: capacity borrowed beyond quota first",
        [make_node("a").gpus(4).build(), make_node("b").gpus(4).build()],
        [
            J("own").priority("best-effort").running_on(*holding("own", "a", 4)).build(),
            J("lent").priority("research").running_on(*holding("lent", "b", 4)).build(),
            J("hi").gpus(4).priority("train").build(),
        ],
        borrowed=frozenset({"lent"}),
        preempted={"lent"},
        nominated={"hi"},
    ),
    Scenario(
        "the cheapest victim: least work lost since its last checkpoint",
        [make_node("a").gpus(4).build(), make_node("b").gpus(4).build()],
        [
            J("fresh-ckpt")
            .priority("research")
            .checkpoint(600)
            .started_at(NOW - 610)
            .running_on(*holding("x", "a", 4))
            .build(),
            J("stale-ckpt")
            .priority("research")
            .checkpoint(600)
            .started_at(NOW - 590)
            .running_on(*holding("y", "b", 4))
            .build(),
            J("hi").gpus(4).priority("train").build(),
        ],
        preempted={"fresh-ckpt"},
        nominated={"hi"},
    ),
    Scenario(
        "only the victims the preemptor needs are preempted",
        [n8("a"), n8("b")],
        [
            J("v1").priority("research").running_on(*holding("v1", "a", 4)).build(),
            J("v2").priority("research").running_on(*holding("v2", "a", 4, start=4)).build(),
            J("v3").priority("best-effort").running_on(*holding("v3", "b", 2)).build(),
            J("hi").gpus(8).priority("train").build(),
        ],
        preempted={"v3"},
        nominated={"hi"},
    ),
    Scenario(
        "a gang victim is preempted whole, and a gang preemptor gets a plan that fits whole",
        [n8("a"), n8("b")],
        [
            J("gang").priority("research").running_on(*holding("g", "a", 8), *holding("g", "b", 8)).build(),
            J("hi").gpus(8, replicas=2).priority("train").build(),
        ],
        preempted={"gang"},
        nominated={"hi"},
    ),
    Scenario(
        "no plan, no preemption: a gang that cannot fit even with every victim gone preempts nobody",
        [n8("a1", "r1"), n8("b1", "r2")],
        [
            J("v").priority("research").running_on(*holding("v", "a1", 8)).build(),
            J("hi").gpus(8, replicas=2).priority("train").topology("rack").build(),
        ],
        waiting={"hi": "in one rack"},
    ),
    Scenario(
        "jobs already stopping are not preempted again",
        [n8("a")],
        [
            J("low").priority("research").running_on(*holding("low", "a", 8)).stopping().build(),
            J("hi").gpus(8).priority("train").build(),
        ],
        waiting={"hi": "waiting"},
    ),
    Scenario(
        "nominated GPUs wait for the preemptor; nobody else takes them",
        [make_node("a").gpus(4).build()],
        [
            J("v").priority("research").running_on(*holding("v", "a", 2)).stopping().build(),
            J("hi").gpus(4).priority("train").nominated(*holding("hi", "a", 4)).build(),
            J("other").gpus(2).priority("inference").at(0).build(),
        ],
        waiting={"hi": "waiting for v to stop", "other": "waiting"},
    ),
    Scenario(
        "a preemptor read back from its record waits for the victims it names there, also one holding only quota",
        [make_node("a").gpus(4).build(), make_node("b").gpus(4).build()],
        [
            J("v").priority("research").running_on(*holding("v", "b", 2)).stopping().build(),
            msgspec.structs.replace(
                J("hi").gpus(4).priority("train").nominated(*holding("hi", "a", 4)).build(), waiting_for=["v/1"]
            ),
        ],
        waiting={"hi": "waiting for v to stop"},
    ),
    Scenario(
        "a preemptor starts on its nominated GPUs once its victims are gone",
        [make_node("a").gpus(4).build()],
        [
            J("hi").gpus(4).priority("train").nominated(*holding("hi", "a", 4)).build(),
            J("other").gpus(2).priority("inference").at(0).build(),
        ],
        placed={"hi": {"a"}},
        waiting={"other": "waiting"},
    ),
    # ---- interruption
    Scenario(
        "a fatal fault interrupts its job at once",
        [n8("a")],
        [J("t").priority("train").grace_s(60).running_on(*holding("t", "a", 8)).build()],
        cordoned={"a/3": fatal("XID 79")},
        preempted={"t"},
        grace={"t": 0},
    ),
    Scenario(
        "a job with a degraded GPU and a fatal one is interrupted at once (found by review: the first slot decided)",
        [n8("a")],
        [J("t").priority("train").grace_s(60).running_on(*holding("t", "a", 8)).build()],
        cordoned={"a/0": degraded("thermal"), "a/5": fatal("XID 48")},
        preempted={"t"},
        grace={"t": 0},
    ),
    Scenario(
        "a degraded GPU drains its job with the checkpoint grace",
        [n8("a")],
        [J("t").priority("train").grace_s(60).running_on(*holding("t", "a", 8)).build()],
        cordoned={"a/3": degraded("thermal")},
        preempted={"t"},
        grace={"t": 60},
    ),
    Scenario(
        "a GPU that fails during a job's checkpoint grace cuts the grace (found by review: the job held its GPUs, "
        "and waited to start again elsewhere, for the whole grace)",
        [n8("a")],
        [J("t").priority("train").grace_s(600).running_on(*holding("t", "a", 8)).stopping().build()],
        cordoned={"a/3": fatal("XID 79")},
        preempted={"t"},
        grace={"t": 0},
    ),
    Scenario(
        "a degraded fault during a job's checkpoint grace leaves the grace",
        [n8("a")],
        [J("t").priority("train").grace_s(600).running_on(*holding("t", "a", 8)).stopping().build()],
        cordoned={"a/3": degraded("thermal")},
    ),
    Scenario(
        "a job stopping at once already is not asked again",
        [n8("a")],
        [
            msgspec.structs.replace(
                J("t").priority("train").grace_s(600).running_on(*holding("t", "a", 8)).stopping().build(),
                stop_grace_s=0.0,
            )
        ],
        cordoned={"a/3": fatal("XID 79")},
    ),
]


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(sc: Scenario) -> None:
    owners = {g.slot: f"{r.id}/{r.attempt}" for r in sc.jobs if r.placement for g in r.placement.gpus}
    predictor = RuntimePredictor()
    for team, name, gpus, run_s in sc.history:
        predictor.observe(team, name, gpus, run_s)
    state = SchedulingState.from_snapshot(
        sc.nodes, owners, sc.cordoned, sc.jobs, standing=sc.standing, borrowed=sc.borrowed, config=sc.config,
        predictor=predictor,
    )  # fmt: skip
    decisions = state.cycle(NOW)
    placed = {d.job_id: d.gpus for d in decisions if isinstance(d, Place)}
    assert set(placed) == set(sc.placed), decisions
    for job_id, expected in sc.placed.items():
        got = placed[job_id]
        if isinstance(expected, set):
            assert {g.node for g in got} == expected, got
        else:
            assert [(g.node, g.index) for g in got] == expected
    preempts = {d.job_id: d for d in decisions if isinstance(d, Preempt)}
    assert set(preempts) == sc.preempted, decisions
    for job_id, grace in sc.grace.items():
        assert preempts[job_id].grace_s == grace
    assert {d.job_id for d in decisions if isinstance(d, Nominate)} == sc.nominated, decisions
    waits = {d.job_id: d.reason for d in decisions if isinstance(d, Wait)}
    for job_id, phrase in sc.waiting.items():
        assert job_id in waits, decisions
        assert phrase in waits[job_id], waits[job_id]


def test_a_grace_is_cut_once() -> None:
    record = J("t").priority("train").grace_s(600).running_on(*holding("t", "a", 8)).stopping().build()
    state = SchedulingState.from_snapshot([n8("a")], {g.slot: "t/1" for g in record.placement.gpus},  # type: ignore[union-attr]
                                          {"a/3": fatal("XID 79")}, [record])  # fmt: skip
    (cut,) = [d for d in state.cycle(NOW) if isinstance(d, Preempt)]
    assert (cut.grace_s, cut.interrupt) == (0.0, True)
    assert "failed during its checkpoint grace" in cut.reason
    assert not [d for d in state.cycle(NOW + 1) if isinstance(d, Preempt)]


def test_the_stored_words_of_a_wait_do_not_name_the_jobs_capacity_is_reserved_for() -> None:
    """The same wait behind a reservation held for another job stores the same words (the record is not written
    again when the reservation passes to another job); the jobs it is held for are live, in the rendering only."""

    def reason_of_long(head: str) -> Reason:
        running = J("r").running_on(*holding("r", "a", 8)).estimate(3600).started_at(NOW - 1200).build()
        assert running.placement is not None
        jobs = [running, J(head).gpus(8, replicas=2).at(0).build(), J("long").gpus(4).estimate(7200).at(1).build()]
        owners = {g.slot: "r/1" for g in running.placement.gpus}
        state = SchedulingState.from_snapshot([n8("a"), n8("b")], owners, {}, jobs, config=EASY)
        (wait,) = [d for d in state.cycle(NOW) if isinstance(d, Wait) and d.job_id == "long"]
        return wait.why

    first, second = reason_of_long("gang-1"), reason_of_long("gang-2")
    assert (first.kind, first.text) == (second.kind, second.text)
    assert "gang" not in first.text
    assert first.reserved_for == ("gang-1",)
    assert "(gang-1)" in first.render()
    many = Reason(
        WaitKind.CAPACITY, "waiting; capacity reserved for jobs ahead", reserved_for=("a", "b", "c"), reserved_more=2
    )
    assert many.render() == "waiting; capacity reserved for jobs ahead (a, b, c and 2 more)"
