"""The health engine, rule by rule and transition by transition."""

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chamber.common.contracts import GpuSample, HealthCommand, HealthState, NodeTelemetry
from chamber.health.core.engine import HealthConfig, HealthEngine

CFG = HealthConfig(probation_s=100, suspect_clear_s=50)


def sample(index: int = 0, **fields: object) -> GpuSample:
    base: dict[str, object] = {
        "ecc_dbe_volatile": 0, "clock_event_reasons": 0, "remapped_rows_pending": False,
        "remapped_rows_failure": False, "nvlink_replay_errors": 0, "pcie_replay_count": 0,
    }  # fmt: skip
    return GpuSample(index=index, uuid=f"GPU-{index}", **{**base, **fields})  # type: ignore[arg-type]


def batch(at: float, *gpus: GpuSample, node: str = "n1", interval: float = 1.0, boot: str = "") -> NodeTelemetry:
    return NodeTelemetry(node=node, sampled_at=at, interval_s=interval, gpus=list(gpus) or [sample()], boot_id=boot)


def engine(nodes: int = 4, gpus: int = 1) -> HealthEngine:
    e = HealthEngine(config=CFG)
    for i in range(nodes):
        e.set_inventory(f"n{i + 1}", gpus, 0.0)
    return e


@dataclass
class Case:
    name: str
    gpu: GpuSample
    state: HealthState | None
    """None: no verdict."""
    scope_node: bool = False
    action: str = ""
    severity: str = ""


CASES = [
    Case("an application XID is not a hardware fault", sample(xids=[13]), None),
    Case("XID 79: the GPU fell off the bus, the node goes", sample(xids=[79]), HealthState.QUARANTINED, True,
         "reboot-node", "fatal"),
    Case("XID 48: double-bit ECC", sample(xids=[48]), HealthState.QUARANTINED, action="reset-gpu", severity="fatal"),
    Case("XID 74: NVLink", sample(xids=[74]), HealthState.QUARANTINED, action="reset-gpu"),
    Case("XID 119: GSP", sample(xids=[119]), HealthState.QUARANTINED, action="reboot-node"),
    Case("volatile DBE", sample(ecc_dbe_volatile=1), HealthState.QUARANTINED, action="reset-gpu", severity="fatal"),
    Case("row remap failure needs an RMA", sample(remapped_rows_failure=True), HealthState.QUARANTINED, action="rma"),
    Case("pending remap drains for a reset", sample(remapped_rows_pending=True), HealthState.QUARANTINED,
         action="reset-gpu", severity="degraded"),
    Case("retired pages over the limit (pre-Ampere)", sample(retired_pages_dbe=30, retired_pages_sbe=31),
         HealthState.QUARANTINED, action="rma"),
    Case("NVML asks for a recovery action", sample(recovery_action=1), HealthState.QUARANTINED, severity="degraded"),
    Case("one thermal sample is no verdict (flap suppression)", sample(clock_event_reasons=0x20), None),
    Case("absent fields give no signal", GpuSample(index=0, uuid="GPU-0"), None),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rules(case: Case) -> None:
    e = engine()
    e.observe(batch(0.0), 0.0)
    verdicts = e.observe(batch(1.0, case.gpu), 1.0)
    if case.state is None:
        assert verdicts == []
        return
    (v,) = verdicts
    assert v.state == case.state
    assert (v.gpu_index is None) == case.scope_node
    if case.action:
        assert v.action == case.action
    if case.severity:
        assert v.severity == case.severity


def test_nvlink_errors_degrade_at_a_sustained_rate_only() -> None:
    e = engine()
    states = []
    for t in range(5):
        states += [v.state for v in e.observe(batch(float(t), sample(nvlink_replay_errors=t * 100)), float(t))]
    assert states == [HealthState.SUSPECT, HealthState.QUARANTINED]


@pytest.mark.parametrize("interval", [1.0, 5.0])
def test_correctable_ecc_degrades_at_a_sustained_rate_not_for_isolated_errors(interval: float) -> None:
    e = engine()
    sbe, states = 0, []
    for k in range(200):
        sbe += 40 if k % 50 == 10 else 0  # an isolated burst now and then: one hit each, far apart
        states += [v.state for v in e.observe(batch(k * interval, sample(ecc_sbe_volatile=sbe), interval=interval),
                                              k * interval)]  # fmt: skip
    assert HealthState.QUARANTINED not in states
    t0 = 200 * interval
    for k in range(3):
        sbe += int(50 * interval)  # 50 errors a second, sample after sample
        states += [v.state for v in e.observe(batch(t0 + k * interval, sample(ecc_sbe_volatile=sbe),
                                                    interval=interval), t0 + k * interval)]  # fmt: skip
    assert states[-1] == HealthState.QUARANTINED
    assert e.entities[("n1", 0)].rule == "ecc-sbe-rate"


def test_brief_throttles_never_degrade_and_a_minute_of_throttling_does() -> None:
    e = engine()
    got = []
    for t in range(300):
        throttled = t % 40 < 5  # five seconds of throttling every forty
        reasons = 0x20 if throttled else 0
        got += e.observe(batch(float(t), sample(clock_event_reasons=reasons)), float(t))
    assert HealthState.QUARANTINED not in [v.state for v in got]
    for t in range(300, 361):
        got += e.observe(batch(float(t), sample(clock_event_reasons=0x40)), float(t))
    assert got[-1].state == HealthState.QUARANTINED
    assert (got[-1].rule, got[-1].severity) == ("thermal-throttle-sustained", "degraded")
    assert [v.state for v in got].count(HealthState.QUARANTINED) == 1
    assert e.entities[("n1", 0)].streaks["thermal-throttle-sustained"] == 300.0, "held since its first sample"


def test_windows_are_measured_in_sample_time() -> None:
    """Three NVLink hits a minute apart in sample time stay apart, however fast a backlog is read."""
    e = engine()
    states = []
    for k in range(6):
        at = 61.0 * k
        states += [v.state for v in e.observe(batch(at, sample(nvlink_replay_errors=0)), 1000.0)]
        states += [v.state for v in e.observe(batch(at + 1, sample(nvlink_replay_errors=100)), 1000.0)]
        states += [v.state for v in e.observe(batch(at + 2, sample(nvlink_replay_errors=100)), 1000.0)]
    assert HealthState.QUARANTINED not in states


@pytest.mark.parametrize(
    ("reasons", "suspect"),
    [
        (0x04, False),  # SW power cap: a busy GPU at its power limit (an H200 running bf16 products at 659 W)
        (0x01 | 0x04, False),  # idle clocks and the power cap
        (0x80, True),  # HW power brake: the board's power supply asked for slowdown
        (0x08, True),  # HW slowdown: clocks halved by the hardware
    ],
    ids=["sw-power-cap", "idle-and-power-cap", "hw-power-brake", "hw-slowdown"],
)
def test_working_at_the_power_limit_is_no_warning_but_hardware_slowdowns_are(reasons: int, suspect: bool) -> None:
    e = engine()
    got = []
    for t in range(10):
        got += e.observe(batch(float(t), sample(clock_event_reasons=reasons)), float(t))
    assert [v.state for v in got] == ([HealthState.SUSPECT] if suspect else [])


def test_thermal_warnings_mark_suspect_then_clear() -> None:
    e = engine()
    got = []
    for t in range(4):
        got += e.observe(batch(float(t), sample(clock_event_reasons=0x20)), float(t))
    assert [v.state for v in got] == [HealthState.SUSPECT], "only after three hits, and only suspect"
    for t in range(4, 80):
        e.observe(batch(float(t), sample()), float(t))
        got += e.tick(float(t))
    assert got[-1].state == HealthState.HEALTHY


@pytest.mark.parametrize(
    ("interval", "limit"), [(1.0, 30.0), (5.0, 30.0), (20.0, 60.0)], ids=["1s-agent", "5s-agent", "20s-agent"]
)
def test_a_node_is_lost_after_three_intervals_and_at_least_thirty_seconds(interval: float, limit: float) -> None:
    e = engine()
    e.observe(batch(0.0, node="n1", interval=interval), 0.0)
    e.observe(batch(limit + 0.4, node="n2", interval=interval), limit + 0.4)  # the rest of the fleet reports
    assert e.tick(limit - 0.5) == [], "a late sample or an agent restart is not a lost node"
    (v,) = e.tick(limit + 0.5)
    assert (v.node, v.gpu_index, v.state, v.rule) == ("n1", None, HealthState.QUARANTINED, "heartbeat-loss")


def test_a_silent_node_and_a_missing_gpu_take_the_node_out() -> None:
    e = engine()
    e.observe(batch(0.0, node="n1", interval=5.0), 0.0)
    e.observe(batch(30.5, node="n3", interval=5.0), 30.5)
    assert e.tick(29.0) == []
    (v,) = e.tick(31.0)
    assert (v.node, v.gpu_index, v.state, v.rule) == ("n1", None, HealthState.QUARANTINED, "heartbeat-loss")
    e.set_inventory("n2", 2, 0.0)
    got = [x for t in (20.0, 25.0, 30.0) for x in e.observe(batch(t, sample(0), node="n2"), t)]
    (v,) = [x for x in got if x.gpu_index is None]
    assert v.rule == "gpu-count-drop"


def test_a_lagging_health_service_or_a_stalled_telemetry_path_loses_no_node() -> None:
    """Silence is judged against the newest sample read from anyone: reading a backlog 60 s late, or hearing from
    nobody at all, is not every node dying."""
    e = engine(nodes=3)
    for t in range(10):
        for n in ("n1", "n2", "n3"):
            e.observe(batch(float(t), node=n), 60.0 + t)  # read a minute after they were sampled
        assert e.tick(60.0 + t) == []
    assert e.tick(600.0) == [], "nobody reports at all: the telemetry path is down, not the fleet"


def test_the_breaker_alerts_once_per_window_not_every_tick() -> None:
    e = engine(nodes=4)
    for t in range(3):
        for n in ("n1", "n2", "n3", "n4"):
            e.observe(batch(float(t), node=n), float(t))
    alerts = []
    for t in range(40, 300):  # n1..n3 fell silent; n4 reports; all within one breaker window
        e.observe(batch(float(t), node="n4"), float(t))
        alerts += [v for v in e.tick(float(t)) if v.breaker_open]
    quarantined = [k for k, ent in e.entities.items() if ent.state == HealthState.QUARANTINED]
    assert len(quarantined) == 2, "half of four nodes, not more"
    assert len(alerts) == 1, "the held-back node is alerted once per breaker window, not at every tick"


def test_quarantine_recovers_after_clean_probation() -> None:
    e = engine()
    e.observe(batch(0.0, sample(ecc_dbe_volatile=1)), 0.0)
    states = []
    for t in range(1, 260):
        e.observe(batch(float(t), sample()), float(t))
        states += [v.state for v in e.tick(float(t))]
    assert states == [HealthState.RECOVERING, HealthState.HEALTHY]


def test_a_fault_during_probation_sends_it_back() -> None:
    e = engine()
    e.observe(batch(0.0, sample(ecc_dbe_volatile=1)), 0.0)
    for t in range(1, 120):
        e.observe(batch(float(t), sample()), float(t))
        e.tick(float(t))
    assert e.entities[("n1", 0)].state == HealthState.RECOVERING
    (v,) = e.observe(batch(120.0, sample(xids=[48])), 120.0)
    assert v.state == HealthState.QUARANTINED


def test_a_repeat_offender_stays_out_until_an_operator_releases_it() -> None:
    e = engine()
    t = 0.0
    for boot in range(5):  # each fatal XID, then a reboot (which starts its probation) and two clean probations
        e.observe(batch(t, sample(xids=[48]), boot=f"boot-{boot}"), t)
        for _ in range(260):
            t += 1
            e.observe(batch(t, sample(), boot=f"boot-{boot + 1}"), t)
            e.tick(t)
    entity = e.entities[("n1", 0)]
    assert entity.state == HealthState.QUARANTINED
    assert entity.held
    assert entity.action == "rma"
    (v,) = e.command(HealthCommand(node="n1", gpu_index=0, command="release"), t)
    assert v.state == HealthState.HEALTHY


def test_an_operator_cordon_holds_until_released() -> None:
    e = engine()
    (v,) = e.command(HealthCommand(node="n1", gpu_index=None, command="cordon", reason="maintenance"), 0.0)
    assert (v.state, v.held, v.severity) == (HealthState.QUARANTINED, True, "degraded")
    for t in range(1, 500):
        assert e.tick(float(t)) == []


def test_the_circuit_breaker_stops_a_mass_quarantine() -> None:
    e = engine(nodes=10)
    results = []
    for i in range(1, 8):
        results += e.observe(batch(1.0, sample(xids=[48]), node=f"n{i}"), 1.0)
    quarantined = [v for v in results if v.state == HealthState.QUARANTINED]
    held_back = [v for v in results if v.breaker_open]
    assert len(quarantined) == 5, "half the fleet, not more"
    assert len(held_back) == 2
    assert all(v.state == HealthState.SUSPECT for v in held_back)
    soon = e.observe(batch(200.0, sample(xids=[48]), node="n9"), 200.0)
    assert soon[0].breaker_open, "still inside the 5-minute window"
    later = e.observe(batch(400.0, sample(xids=[48]), node="n9"), 400.0)
    assert later[0].state == HealthState.QUARANTINED, "the window has passed: quarantining resumes"


def test_operators_extend_and_override_rules() -> None:
    from chamber.health.core.rules import DEFAULT_RULES, RuleError, merge_rules

    rules = merge_rules([
        {"name": "thermal-throttle", "signal": "thermal_throttle", "severity": "degraded", "count": 1},
        {"name": "xid-13-storm", "signal": "xid", "xids": [13], "severity": "warning"},
    ])  # fmt: skip
    assert len(rules) == len(DEFAULT_RULES) + 1
    e = HealthEngine(rules, CFG)
    e.set_inventory("n1", 1, 0.0)
    (v,) = e.observe(batch(1.0, sample(clock_event_reasons=0x20)), 1.0)
    assert (v.state, v.severity) == (HealthState.QUARANTINED, "degraded")
    with pytest.raises(RuleError, match="severity"):
        merge_rules([{"name": "x", "signal": "xid", "severity": "apocalyptic"}])


SIGNALS = ["ecc_dbe_volatile", "ecc_sbe_rate", "nvlink_error_rate", "pcie_replay_rate", "thermal_throttle",
           "remapped_rows_pending", "recovery_action", "retired_pages_total"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    signals=st.dictionaries(st.sampled_from(SIGNALS), st.one_of(st.just(0.0), st.floats(-5, 100))),
    xids=st.lists(st.sampled_from([13, 48, 74, 79, 119, 123, 999])),
    negative=st.booleans(),
)
def test_the_rule_index_finds_exactly_what_every_rule_finds(signals: dict[str, float], xids: list[int],
                                                            negative: bool) -> None:  # fmt: skip
    from chamber.health.core.rules import DEFAULT_RULES, RuleIndex, matching, merge_rules

    rules = DEFAULT_RULES
    if negative:
        rules = merge_rules([{"name": "any-pcie", "signal": "pcie_replay_rate", "severity": "warning",
                              "threshold": -1.0}])  # fmt: skip
    gpu_rules = tuple(r for r in rules if r.signal not in ("heartbeat_loss", "gpu_count_drop"))
    fast = RuleIndex(gpu_rules).match(signals, xids)
    assert sorted((r.name, v) for r, v in fast) == sorted((r.name, v) for r, v in matching(gpu_rules, signals, xids))
