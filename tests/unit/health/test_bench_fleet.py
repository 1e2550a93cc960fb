"""The health benchmark's fleet: each injected fault makes its own rule fire exactly where `reference` says its
window closes, noise alone does not, and the compressed week sees what a louder noise would do."""

import pytest

from chamber.common.contracts import HealthState
from chamber.health.bench.fleet import FAMILIES, RULE_OF, Noise, NoisyFleet, reference
from chamber.health.bench.week import simulate_week
from chamber.health.core.engine import HealthEngine

SILENT = Noise(sbe_bursts=0, nvlink_blips=0, pcie_blips=0, throttles=0, restarts_per_node=0, late_share=0)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "xid"])
def test_each_fault_quarantines_where_its_window_closes(family: str) -> None:
    fleet = NoisyFleet(2, SILENT, interval_s=1.0)
    engine = HealthEngine()
    for node in fleet.nodes:
        engine.set_inventory(node.name, 8, 0.0)
    fault = fleet.inject(family, 1, 3, at=10.0)
    quarantined = None
    t = 0.0
    while t < 120 and quarantined is None:
        verdicts = engine.tick(t)
        if t == int(t):
            for node in fleet.nodes:
                batch = fleet.sample_node(node, t)
                if batch is not None:
                    verdicts += engine.observe(batch, t)
        hits = [v for v in verdicts if v.state == HealthState.QUARANTINED]
        if hits:
            (v,) = hits
            assert (v.node, v.rule) == (fault.node, RULE_OF[family])
            assert v.gpu_index == (None if fault.node_scoped else 3)
            quarantined = t
        t += 0.25
    ref = reference(fault, engine.silence_limit(1.0))
    assert ref is not None
    assert quarantined is not None
    assert ref <= quarantined <= ref + 0.25, "at the sample that completes the rule (a silence: at the next tick)"


def test_noise_alone_never_quarantines_a_node_for_ten_minutes() -> None:
    fleet = NoisyFleet(4, Noise().scaled(5000), interval_s=1.0)
    engine = HealthEngine()
    verdicts = []
    for t in range(600):
        for node in fleet.nodes:
            batch = fleet.sample_node(node, float(t))
            if batch is not None:
                verdicts += engine.observe(batch, float(t))
        verdicts += engine.tick(float(t))
    assert not [v for v in verdicts if v.state == HealthState.QUARANTINED]
    assert [v for v in verdicts if v.state == HealthState.SUSPECT], "the noise is there: brief throttles warn"


def test_the_compressed_week_finds_noise_that_is_too_loud() -> None:
    loud = Noise(sbe_bursts=2000, sbe_per_burst=(40, 60), nvlink_blips=0, pcie_blips=0, throttles=0,
                 restarts_per_node=3, restart_silence_s=(40.0, 50.0), late_share=0)  # fmt: skip
    week = simulate_week(1, loud)
    assert week.by_rule.get("heartbeat-loss", 0) >= 1, "a 40 s silence is a lost node"
    assert week.by_rule.get("ecc-sbe-rate", 0) >= 1, "bursts of 40+ errors a second, clustered, degrade"


def test_a_quiet_week_on_a_few_nodes_quarantines_nothing() -> None:
    week = simulate_week(4, Noise())
    assert week.noise_events > 0
    assert week.false_quarantines == 0, week.by_rule
