"""Regressions of the health engine: XID events as heartbeats, clock skew, restarts, the worst hit of a sample,
and a node that comes back from a reboot with a GPU missing."""

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from chamber.common.contracts import (
    GpuDevice,
    GpuHealthVerdict,
    GpuSample,
    GpuXidEvent,
    HealthCommand,
    HealthState,
    Node,
    NodeInventory,
    NodeTelemetry,
    Pool,
)
from chamber.health.core.engine import HealthConfig, HealthEngine, physical_gpus
from chamber.health.core.rules import as_batch

CFG = HealthConfig(probation_s=100, suspect_clear_s=50)
NODES = ("n1", "n2", "n3", "n4")


def batch(node: str, at: float, gpus: int = 1, **fields: Any) -> NodeTelemetry:
    samples = [GpuSample(index=i, uuid=f"{node}-{i}", **fields) for i in range(gpus)]
    return NodeTelemetry(node=node, sampled_at=at, interval_s=1.0, gpus=samples)


def engine(gpus: int = 1) -> HealthEngine:
    e = HealthEngine(config=CFG)
    for node in NODES:
        e.set_inventory(node, gpus, 0.0)
    return e


def run(e: HealthEngine, nodes: tuple[str, ...], start: int, stop: int, skew: float = 0.0) -> list[GpuHealthVerdict]:
    """Every node reports each second (n1's clock `skew` off the service's), and the service ticks."""
    out: list[GpuHealthVerdict] = []
    for t in range(start, stop):
        for node in nodes:
            out += e.observe(batch(node, t + (skew if node == "n1" else 0.0)), float(t))
        out += e.tick(t + 0.5)
    return out


def node_rules(verdicts: list[GpuHealthVerdict], node: str) -> list[tuple[HealthState, str]]:
    return [(v.state, v.rule) for v in verdicts if v.node == node and v.gpu_index is None]


def sustained(e: HealthEngine, make: Any, start: float) -> list[GpuHealthVerdict]:
    """A node's batches (`make(t)`) from `start` for the 10 s gpu-count-drop must see a GPU missing in every batch."""
    out: list[GpuHealthVerdict] = []
    for t in (start, start + 5.0, start + 10.0):
        out += e.observe(make(t), t)
    return out


# ---- 1. an XID event is no heartbeat and leaves the counters alone ----------------------------------------------


def test_a_node_silent_after_an_xid_event_is_still_lost() -> None:
    e = engine()
    run(e, NODES, 0, 10)
    xid = GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=43, observed_at=9.5)
    assert e.observe(as_batch(xid), 9.5) == [], "an application XID is nobody's fault"
    got = run(e, NODES[1:], 10, 60)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "heartbeat-loss")]


def test_xid_events_between_samples_keep_the_error_rates() -> None:
    e = HealthEngine(config=CFG)
    got: list[GpuHealthVerdict] = []
    for t in range(10):
        got += e.observe(batch("n1", t, ecc_sbe_volatile=1000 * t), float(t))
        xid = GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=13, observed_at=t + 0.5)
        got += e.observe(as_batch(xid), t + 0.5)
    assert [(v.state, v.rule) for v in got] == [
        (HealthState.SUSPECT, "ecc-sbe-rate"), (HealthState.QUARANTINED, "ecc-sbe-rate"),
    ]  # fmt: skip


# ---- 2. clock skew -----------------------------------------------------------------------------------------------


def test_a_node_whose_clock_lags_by_more_than_the_silence_limit_is_not_lost() -> None:
    e = engine()
    got = run(e, NODES, 100, 400, skew=-40.0)
    assert node_rules(got, "n1") == []
    assert e.entities[("n1", None)].state == HealthState.HEALTHY


def test_a_lagging_node_that_dies_is_still_lost_when_its_arrivals_stop() -> None:
    e = engine()
    run(e, NODES, 100, 200, skew=-40.0)
    got = run(e, NODES[1:], 200, 260)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "heartbeat-loss")]
    when = next(v.observed_at for v in got if v.node == "n1")
    assert 229 < when < 231.5, "the silence limit after its last arrival"


def test_a_node_whose_clock_runs_ahead_is_lost_on_time() -> None:
    """Found by review: a node 600 s ahead that died was found silent 600 s late (its sample times were taken as
    they were); a sample time ahead of the service's counts as the service's."""
    e = engine()
    run(e, NODES, 100, 200, skew=600.0)
    got = run(e, NODES[1:], 200, 260)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "heartbeat-loss")]
    when = next(v.observed_at for v in got if v.node == "n1")
    assert 229 < when < 231.5, "the silence limit after its last arrival"


def test_a_node_ahead_does_not_defeat_the_guard_for_a_service_that_fell_behind() -> None:
    """Found by review: one node's future samples moved the watermark past the service's clock, so a service that
    handled nothing for 40 s found half the fleet lost when it resumed."""
    e = engine()
    run(e, NODES, 100, 140, skew=600.0)
    assert [v for v in e.tick(180.0) if v.state == HealthState.QUARANTINED] == []


def test_hits_from_before_a_clock_step_back_do_not_count_with_later_ones() -> None:
    """Found by review: correctable-ECC hits at 3650 (the node 1 h ahead), then NTP stepped its clock back, and
    isolated hits at 1300 and 2500 read as 3 in 60 s: quarantined."""
    e = engine()
    got: list[GpuHealthVerdict] = []
    for at, sbe in ((3649.0, 0), (3650.0, 1000), (1299.0, 1000), (1300.0, 2000), (2499.0, 2000), (2500.0, 3000)):
        got += e.observe(batch("n1", at, ecc_sbe_volatile=sbe), 50.0 + len(got))
    assert [v.state for v in got if v.state == HealthState.QUARANTINED] == []


# ---- 3. restart ---------------------------------------------------------------------------------------------------


def restored(node: str, gpu: int | None, state: HealthState, at: float, rule: str) -> GpuHealthVerdict:
    return GpuHealthVerdict(node=node, gpu_index=gpu, state=state, reason=rule, observed_at=at, severity="fatal",
                            rule=rule, action="reboot-node")  # fmt: skip


def test_a_node_restored_lost_stays_out_until_it_is_heard_from() -> None:
    e = HealthEngine(config=CFG)
    e.restore(restored("n1", None, HealthState.QUARANTINED, 60.0, "heartbeat-loss"))
    e.restore(restored("n1", 0, HealthState.QUARANTINED, 50.0, "xid-gsp"))
    for node in NODES:
        e.set_inventory(node, 1, 60.0)
    got = run(e, NODES[1:], 60, 1000)
    assert [v for v in got if v.node == "n1"] == []
    assert e.entities[("n1", None)].state == HealthState.QUARANTINED
    assert e.entities[("n1", 0)].state == HealthState.QUARANTINED
    got = run(e, NODES, 1000, 1300)
    assert node_rules(got, "n1") == [(HealthState.RECOVERING, "heartbeat-loss"), (HealthState.HEALTHY, "")]
    assert [v.state for v in got if v.gpu_index == 0] == [HealthState.RECOVERING, HealthState.HEALTHY]
    first = min(v.observed_at for v in got)
    assert first >= 999.5 + CFG.probation_s, "probation starts when it is heard from (its last tick unheard)"


def test_an_xid_event_does_not_count_as_hearing_from_a_restored_node() -> None:
    e = HealthEngine(config=CFG)
    e.restore(restored("n1", None, HealthState.QUARANTINED, 60.0, "heartbeat-loss"))
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=13, observed_at=61.0)), 61.0)
    assert run(e, NODES[1:], 61, 500) == []


def test_a_restored_recovering_entity_keeps_its_second_probation() -> None:
    e = HealthEngine(config=CFG)
    e.restore(restored("n1", 3, HealthState.RECOVERING, 1000.0, "xid-gsp"))
    e.set_inventory("n1", 1, 1000.0)
    assert e.tick(1001.0) == [], "not healthy at the first tick"
    got = run(e, ("n1",), 1001, 1200)
    (v,) = got
    assert (v.gpu_index, v.state) == (3, HealthState.HEALTHY)
    assert 1100 <= v.observed_at <= 1102, "one more probation after the restart, not two"


# ---- 4. the worst hit of one observation wins -------------------------------------------------------------------


def test_a_fatal_xid_in_the_same_sample_as_a_first_correctable_burst_quarantines() -> None:
    e = HealthEngine(config=CFG)
    e.observe(batch("n1", 0, ecc_dbe_volatile=0, ecc_sbe_volatile=0), 0.0)
    (v,) = e.observe(batch("n1", 1, ecc_dbe_volatile=0, ecc_sbe_volatile=500, xids=[48]), 1.0)
    assert (v.state, v.rule, v.severity) == (HealthState.QUARANTINED, "xid-double-bit-ecc", "fatal")


def test_a_first_correctable_burst_alone_still_marks_suspect() -> None:
    e = HealthEngine(config=CFG)
    e.observe(batch("n1", 0, ecc_sbe_volatile=0, clock_event_reasons=0), 0.0)
    (v,) = e.observe(batch("n1", 1, ecc_sbe_volatile=500, clock_event_reasons=0x20), 1.0)
    assert (v.state, v.rule, v.severity) == (HealthState.SUSPECT, "ecc-sbe-rate", "degraded")


# ---- 5. gpu-count-drop against the most GPUs the node has had ---------------------------------------------------


def test_a_node_back_from_a_reboot_with_a_gpu_missing_is_caught() -> None:
    e = engine(gpus=8)
    e.observe(batch("n1", 0, gpus=8), 0.0)
    e.set_inventory("n1", 7, 5.0)  # the agent restarted and sees 7
    got = sustained(e, lambda t: batch("n1", t, gpus=7), 6.0)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "gpu-count-drop")]
    assert got[0].evidence == {"gpu_count_drop": 1.0}


def test_an_operator_release_accepts_the_node_with_fewer_gpus() -> None:
    e = engine(gpus=8)
    e.set_inventory("n1", 7, 5.0)
    e.observe(batch("n1", 6, gpus=7), 6.0)
    e.command(HealthCommand(node="n1", gpu_index=None, command="release", reason="re-provisioned"), 7.0)
    assert e.observe(batch("n1", 8, gpus=7), 8.0) == []
    assert e.entities[("n1", None)].state == HealthState.HEALTHY


def test_a_gpu_release_does_not_reset_the_expected_count() -> None:
    e = engine(gpus=8)
    e.set_inventory("n1", 7, 5.0)
    e.command(HealthCommand(node="n1", gpu_index=3, command="release"), 6.0)
    got = sustained(e, lambda t: batch("n1", t, gpus=7), 8.0)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "gpu-count-drop")]


def devices(whole: int, mig: dict[int, int]) -> list[GpuDevice]:
    """`whole` whole GPUs, then the MIG instances of the GPUs in `mig` (physical index -> how many)."""
    out = [GpuDevice(index=i, uuid=f"GPU-{i}", model="H100") for i in range(whole)]
    for gpu, count in mig.items():
        out += [GpuDevice(index=len(out), uuid=f"MIG-{gpu}-{k}", model="H100", mig_profile="1g.10gb",
                          parent_uuid=f"GPU-{gpu}") for k in range(count)]  # fmt: skip
    return out


def device_batch(node: str, at: float, devs: list[GpuDevice]) -> NodeTelemetry:
    return NodeTelemetry(node=node, sampled_at=at, interval_s=1.0,
                         gpus=[GpuSample(index=d.index, uuid=d.uuid) for d in devs])  # fmt: skip


def test_mig_reconfiguration_is_no_gpu_count_drop() -> None:
    e = HealthEngine(config=CFG)
    layouts = [devices(8, {}), devices(7, {7: 7}), devices(6, {6: 2, 7: 1}), devices(8, {})]
    for k, devs in enumerate(layouts):
        count, parents = physical_gpus(devs)
        assert count == 8
        e.set_inventory("n1", count, float(k), parents)
        assert e.observe(device_batch("n1", k + 0.5, devs), k + 0.5) == []


def test_a_mig_node_that_loses_a_whole_gpu_is_caught() -> None:
    e = HealthEngine(config=CFG)
    devs = devices(7, {7: 7})
    e.set_inventory("n1", *physical_gpus(devs)[:1], 0.0, physical_gpus(devs)[1])
    e.observe(device_batch("n1", 1, devs), 1.0)
    got = sustained(e, lambda t: device_batch("n1", t, devs[1:]), 2.0)  # 13 devices, but only 7 physical GPUs
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "gpu-count-drop")]


def test_the_service_hands_the_engine_physical_gpus() -> None:
    """MIG reconfiguration changes the devices, not the GPUs; a reboot that loses a GPU changes the GPUs."""
    from chamber.health.service import Health

    e = HealthEngine(config=CFG)
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 0.0))
    shell = Health(ctx, bus=None, ledger=None, engine=e)  # type: ignore[arg-type]
    pool = Pool(name="h100", gpu_model="H100")

    def inventory(devs: list[GpuDevice]) -> None:
        shell._on_inventory(NodeInventory(node=Node(name="n1", pool="h100", gpus=devs), pool=pool, observed_at=0.0))
        assert shell.inventory["n1"] == [d.index for d in devs], "the ledger's slots are still the devices"

    for k, devs in enumerate([devices(7, {7: 7}), devices(7, {7: 2})]):  # GPU 7 re-partitioned: 14, then 9 devices
        inventory(devs)
        assert e.observe(device_batch("n1", k, devs), float(k)) == []
    rebooted = devices(6, {7: 2})  # back from a reboot without GPU 6: 8 devices, 7 GPUs
    inventory(rebooted)
    got = sustained(e, lambda t: device_batch("n1", t, rebooted), 5.0)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "gpu-count-drop")]


def test_a_gpu_its_agent_could_not_read_at_start_counts_as_missing() -> None:
    """A GPU that fell off the bus before the agent (re)started is not in the agent's devices; the inventory says how
    many such GPUs the node has, so health takes the node out though it never saw the GPU in this process."""
    from chamber.health.service import Health

    e = HealthEngine(config=CFG)
    ctx = SimpleNamespace(clock=SimpleNamespace(now=lambda: 0.0))
    shell = Health(ctx, bus=None, ledger=None, engine=e)  # type: ignore[arg-type]
    readable = devices(7, {})
    node = Node(name="n1", pool="h100", gpus=readable, unreadable_gpus=1)
    shell._on_inventory(NodeInventory(node=node, pool=Pool(name="h100", gpu_model="H100"), observed_at=0.0))
    got = sustained(e, lambda t: device_batch("n1", t, readable), 1.0)
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "gpu-count-drop")]


# ---- XIDs that ask for a reset when convenient ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("xid", "state", "severity"),
    [
        (48, HealthState.QUARANTINED, "fatal"),  # double-bit ECC: the GPU's memory cannot be trusted
        (95, HealthState.QUARANTINED, "fatal"),  # uncontained ECC error: every process on the GPU is affected
        (64, HealthState.QUARANTINED, "fatal"),  # a page retirement or row remap failed
        (63, HealthState.QUARANTINED, "degraded"),  # a row remapped: jobs may go on, reset when convenient
        (92, HealthState.QUARANTINED, "degraded"),  # high single-bit ECC rate
        (94, HealthState.QUARANTINED, "degraded"),  # contained ECC error: only the process that hit it died
        (43, None, None),  # an application XID: the job's fault, not the GPU's
    ],
)
def test_each_xid_is_judged_by_what_nvidia_recommends(
    xid: int, state: HealthState | None, severity: str | None
) -> None:
    e = HealthEngine(config=CFG)
    verdicts = e.observe(batch("n1", 0, xids=[xid]), 0.0)
    got = [(v.state, v.severity) for v in verdicts if v.gpu_index == 0]
    assert got == ([] if state is None else [(state, severity)])


# ---- a node that died while the service was down ---------------------------------------------------------------


def test_a_node_that_died_while_the_service_was_down_is_found_lost() -> None:
    """n1 reported until t=500 and died; the service restarted at t=600 and reads each node's last sample from the
    bus. The others report again; n1 never does, and is lost once its silence limit passes after the restart (it
    used to be watched only once it reported again: never)."""
    e = engine()
    for node in NODES:
        e.heard_before(batch(node, 500.0 if node == "n1" else 599.0), 600.0)
    lost: list[str] = []
    for t in range(600, 700):
        for node in NODES[1:]:
            e.observe(batch(node, float(t)), float(t))
        lost += [v.node for v in e.tick(float(t)) if v.state == HealthState.QUARANTINED]
    assert lost == ["n1"]
    assert e.entities[("n1", None)].rule == "heartbeat-loss"


def test_after_a_restart_a_silent_fleet_is_not_lost() -> None:
    """The telemetry path itself is down after the restart (nothing arrives from anyone): no node is lost for it."""
    e = engine()
    for node in NODES:
        e.heard_before(batch(node, 599.0), 600.0)
    assert not [v for t in range(600, 800) for v in e.tick(float(t))]


# ---- 8. a fatal XID leaves nothing to watch clear: it waits for a reboot or an operator ------------------------


def booted(
    e: HealthEngine, nodes: tuple[str, ...], start: int, stop: int, boot: str, **fields: Any
) -> list[GpuHealthVerdict]:
    """As `run`, every batch from boot `boot` (its samples carrying `fields`)."""
    out: list[GpuHealthVerdict] = []
    for t in range(start, stop):
        for node in nodes:
            out += e.observe(msgspec.structs.replace(batch(node, float(t), **fields), boot_id=boot), float(t))
        out += e.tick(t + 0.5)
    return out


@pytest.mark.parametrize(("xid", "gpu"), [(74, 0), (119, 0), (48, 0), (79, None)])
def test_a_fatal_xid_is_not_released_by_clean_samples_alone(xid: int, gpu: int | None) -> None:
    """An NVLink, GSP or double-bit XID stays until a reset; the GPU's samples after it are clean whether or not the
    GPU was reset (an XID is an event, not a counter), so clean time is no evidence. It used to come back after two
    probations, to ruin the next week-long run."""
    e = engine()
    booted(e, NODES, 0, 10, "boot-a")
    (v,) = e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=xid, observed_at=10.0)), 10.0)
    assert (v.gpu_index, v.state, v.awaiting_reset, v.boot_id) == (gpu, HealthState.QUARANTINED, True, "boot-a")
    assert "until the node reboots or an operator releases it" in v.reason
    assert booted(e, NODES, 10, 10 + 10 * int(CFG.probation_s), "boot-a") == []
    assert e.entities[("n1", gpu)].state == HealthState.QUARANTINED


def test_a_reboot_starts_the_probation_of_what_waited_for_a_reset() -> None:
    e = engine()
    booted(e, NODES, 0, 10, "boot-a")
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=10.0)), 10.0)
    booted(e, NODES, 10, 500, "boot-a")
    got = booted(e, NODES, 500, 800, "boot-b")  # the node came back from a reboot at 500
    assert [(v.state, v.observed_at) for v in got] == [
        (HealthState.RECOVERING, 500.5 + CFG.probation_s),
        (HealthState.HEALTHY, 500.5 + 2 * CFG.probation_s),
    ]


def test_an_operator_release_frees_what_waited_for_a_reset() -> None:
    """A GPU reset (`nvidia-smi -r`) changes no boot ID: whoever reset it releases it."""
    e = engine()
    booted(e, NODES, 0, 10, "boot-a")
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=10.0)), 10.0)
    (v,) = e.command(HealthCommand(node="n1", gpu_index=0, command="release"), 20.0)
    assert (v.state, v.awaiting_reset) == (HealthState.HEALTHY, False)
    assert booted(e, NODES, 20, 400, "boot-a") == []


def test_a_release_issued_before_a_later_fault_does_not_clear_it() -> None:
    """Found by review: an operator's release delivered again after its ack was lost (or replayed at a restart)
    released a GPU that had been quarantined since for a new fault. A release clears what was seen before it was
    issued; one issued after the fault still releases, also while the fault's signal persists."""
    e = engine()
    booted(e, NODES, 0, 10, "boot-a")
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=10.0)), 10.0)
    order = HealthCommand(node="n1", gpu_index=0, command="release", issued_at=15.0)
    (v,) = e.command(order, 15.5)
    assert v.state == HealthState.HEALTHY
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=30.0)), 30.0)
    assert e.command(order, 40.0) == [], "the same order again: it did not see the fault at 30"
    assert e.entities[("n1", 0)].state == HealthState.QUARANTINED
    for t in (41.0, 42.0):  # the fault's signal persists: hits while out do not make a release stale
        e.observe(msgspec.structs.replace(batch("n1", t, ecc_dbe_volatile=3), boot_id="boot-a"), t)
    (v,) = e.command(msgspec.structs.replace(order, issued_at=41.5), 42.5)
    assert v.state == HealthState.HEALTHY, "issued after the fault: carried out"
    old = HealthCommand(node="n1", gpu_index=0, command="release")  # (no issue time: an older gateway's) carried out
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=50.0)), 50.0)
    assert [v.state for v in e.command(old, 51.0)] == [HealthState.HEALTHY]


def test_a_release_replayed_after_a_restart_does_not_clear_a_quarantine_made_after_it() -> None:
    first = engine()
    booted(first, NODES, 0, 10, "boot-a")
    (v,) = first.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=30.0)), 30.0)
    second = engine()
    second.restore(v)
    assert second.command(HealthCommand(node="n1", gpu_index=0, command="release", issued_at=20.0), 40.0) == []
    (done,) = second.command(HealthCommand(node="n1", gpu_index=0, command="release", issued_at=35.0), 40.0)
    assert done.state == HealthState.HEALTHY
    cordoned = engine()
    (c,) = cordoned.command(HealthCommand(node="n1", gpu_index=0, command="cordon", issued_at=5.0), 6.0)
    restored = engine()
    restored.restore(c)
    (r,) = restored.command(HealthCommand(node="n1", gpu_index=0, command="release", issued_at=5.5), 7.0)
    assert r.state == HealthState.HEALTHY, "an operator's own cordon is no fault: a release after it frees it"


def test_a_node_without_a_boot_id_waits_for_the_operator() -> None:
    """A source that reports no boot ID (not a node agent) gives no evidence of a reboot."""
    e = engine()
    run(e, NODES, 0, 10)
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=120, observed_at=10.0)), 10.0)
    assert booted(e, NODES, 10, 1000, "boot-new") == [], "a first boot ID is not a new one"
    assert e.entities[("n1", 0)].awaiting_reset


@pytest.mark.parametrize(("boot_after", "released"), [("boot-a", False), ("boot-b", True)])
def test_after_a_restart_what_waits_for_a_reset_waits_for_a_boot_the_node_had_not_then(
    boot_after: str, released: bool
) -> None:
    """The verdict carries the boot it was made in: a node that rebooted while health was down is released by its
    first sample, one that did not is not (its last sample before the restart names the same boot)."""
    first = engine()
    booted(first, NODES, 0, 10, "boot-a")
    (v,) = first.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=10.0)), 10.0)
    second = engine()
    second.restore(v)
    second.heard_before(msgspec.structs.replace(batch("n1", 20.0), boot_id="boot-a"), 30.0)
    got = booted(second, NODES, 30, 30 + 3 * int(CFG.probation_s), boot_after)
    assert [v.state for v in got if v.node == "n1"] == (
        [HealthState.RECOVERING, HealthState.HEALTHY] if released else []
    )


def test_a_fatal_xid_the_breaker_held_back_leaves_nothing_waiting_for_a_reset() -> None:
    """The breaker keeps the GPU healthy (an alert, not a quarantine): a later quarantine for another reason must
    recover by probation as usual, not wait for a reboot that the first fault never asked for."""
    e = engine()
    booted(e, NODES, 0, 10, "boot-a")
    for node in ("n2", "n3", "n1"):  # the third node would put more than half the fleet in quarantine
        e.observe(as_batch(GpuXidEvent(node=node, gpu_index=0, uuid=f"{node}-0", xid=74, observed_at=10.0)), 10.0)
    entity = e.entities[("n1", 0)]
    assert (entity.state, entity.awaiting_reset) == (HealthState.HEALTHY, False)
    later = 10.0 + CFG.breaker_window_s + 1
    (v,) = e.observe(msgspec.structs.replace(batch("n1", later, ecc_dbe_volatile=1), boot_id="boot-a"), later)
    assert (v.state, v.awaiting_reset) == (HealthState.QUARANTINED, False)
    got = booted(e, ("n1",), int(later) + 1, int(later) + 1 + 3 * int(CFG.probation_s), "boot-a", ecc_dbe_volatile=0)
    assert [v.state for v in got if v.gpu_index == 0] == [HealthState.RECOVERING, HealthState.HEALTHY]


def test_an_operator_release_accepts_a_node_without_the_gpu_its_agent_cannot_read() -> None:
    e = HealthEngine(config=CFG)
    readable = devices(7, {})
    count, parents = physical_gpus(readable)
    e.set_inventory("n1", count, 0.0, parents, unreadable=1)
    assert node_rules(sustained(e, lambda t: device_batch("n1", t, readable), 1.0), "n1") == [
        (HealthState.QUARANTINED, "gpu-count-drop")
    ]
    (v,) = e.command(HealthCommand(node="n1", gpu_index=None, command="release"), 12.0)
    assert v.state == HealthState.HEALTHY
    assert sustained(e, lambda t: device_batch("n1", t, readable), 13.0) == [], "the node is taken with its GPUs"


def test_a_reboot_seen_just_before_a_restart_still_starts_the_probation() -> None:
    """The reboot was noticed (no verdict yet: the probation had not passed) and then health restarted: the restored
    verdict still waits for a reset, and the node's last sample, read at start, is already from the new boot."""
    first = engine()
    booted(first, NODES, 0, 10, "boot-a")
    (v,) = first.observe(as_batch(GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=74, observed_at=10.0)), 10.0)
    second = engine()
    second.heard_before(msgspec.structs.replace(batch("n1", 40.0), boot_id="boot-b"), 50.0)
    second.restore(v)
    got = booted(second, NODES, 50, 50 + 3 * int(CFG.probation_s), "boot-b")
    assert [v.state for v in got if v.node == "n1"] == [HealthState.RECOVERING, HealthState.HEALTHY]


# ---- a fatal fault on a GPU already out as degraded ---------------------------------------------------------------


@pytest.mark.parametrize("xid", [48, 74, 79])
def test_a_fatal_xid_on_a_gpu_quarantined_as_degraded_escalates_it(xid: int) -> None:
    """Found by review: a GPU quarantined as degraded (pending row remaps) took a fatal XID, which was dropped (it
    was out already); the GPU then came back after its probation without the reset the XID asks for, and its jobs
    had been drained with their grace rather than interrupted."""
    e = engine()
    run(e, NODES, 0, 3)
    got = e.observe(batch("n1", 3.0, remapped_rows_pending=True), 3.0)
    assert [(v.state, v.severity) for v in got] == [(HealthState.QUARANTINED, "degraded")]
    event = GpuXidEvent(node="n1", gpu_index=0, uuid="n1-0", xid=xid, observed_at=3.5)
    got = e.observe(as_batch(event), 3.5)
    assert [(v.state, v.severity, v.awaiting_reset) for v in got] == [(HealthState.QUARANTINED, "fatal", True)], got
    run(e, NODES, 4, 1300)  # clean samples, the same boot: no reset
    out = e.entities[("n1", None if xid == 79 else 0)]
    assert (out.state, out.severity) == (HealthState.QUARANTINED, "fatal")


def test_a_node_fatal_cordon_is_not_replaced_by_a_gpus_degraded_one() -> None:
    """Found by review: reconcile kept the first entity's cordon per GPU slot; a GPU out as degraded replaced its
    node's fatal cordon (XID 79) within 5 s, and the GPU's jobs were drained with their grace."""
    from chamber.health.service import Health

    e = engine(gpus=2)
    for t in range(3):
        for node in NODES:
            e.observe(batch(node, float(t), gpus=2), float(t))
    e.observe(batch("n1", 3.0, gpus=2, remapped_rows_pending=True), 3.0)
    e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=1, uuid="n1-1", xid=79, observed_at=3.5)), 3.5)
    health = Health.__new__(Health)
    health.engine = e
    health.inventory = {"n1": [0, 1]}
    wanted = health._wanted_cordons()
    assert {slot: c.severity for slot, c in wanted.items()} == {"n1/0": "fatal", "n1/1": "fatal"}


def test_a_node_quarantined_for_a_gpu_that_fell_off_the_bus_names_that_gpu() -> None:
    """Found by review: XID 79 takes the whole node out (the GPU is gone from the bus until a reboot), and its
    verdict said only `xid-fallen-off-bus: 79`: the operator who reboots it, or replaces the part, had to find
    which of the eight GPUs in the node's logs."""
    e = engine(gpus=8)
    for t in range(3):
        for node in NODES:
            e.observe(batch(node, float(t), gpus=8), float(t))
    (v,) = e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=5, uuid="GPU-5e", xid=79, observed_at=3.5)), 3.5)
    assert (v.node, v.gpu_index, v.state) == ("n1", None, HealthState.QUARANTINED)
    assert v.reason.startswith("xid-fallen-off-bus: 79 on GPU 5 (GPU-5e)"), v.reason
    (gpu,) = e.observe(as_batch(GpuXidEvent(node="n1", gpu_index=2, uuid="GPU-2e", xid=48, observed_at=4.0)), 4.0)
    assert gpu.reason.startswith("xid-double-bit-ecc: 48;"), "a GPU's own verdict names it already"


def test_samples_without_the_signal_a_gpu_is_out_for_do_not_bring_it_back() -> None:
    """Found by review: a GPU out for double-bit ECC errors whose later samples lacked the ECC fields (the agent's
    read failed, or the driver stopped answering) counted them as clean and came back after its probations."""
    e = engine()
    booted(e, NODES, 0, 3, "boot-a")
    (v,) = e.observe(msgspec.structs.replace(batch("n1", 3.0, ecc_dbe_volatile=2), boot_id="boot-a"), 3.0)
    assert v.state == HealthState.QUARANTINED
    got = booted(e, ("n1",), 4, 4 + 3 * int(CFG.probation_s), "boot-a")  # no ECC field in any sample
    assert [v.state for v in got if v.gpu_index == 0] == []
    got = booted(e, ("n1",), 4 + 3 * int(CFG.probation_s), 4 + 6 * int(CFG.probation_s), "boot-a", ecc_dbe_volatile=0)
    assert [v.state for v in got if v.gpu_index == 0] == [HealthState.RECOVERING, HealthState.HEALTHY]


def test_a_fault_the_breaker_held_back_is_one_fatal_event_not_one_a_sample() -> None:
    """Found by review: while the breaker held a persistent double-bit error back, every sample added a fatal
    event; once the breaker closed the GPU was quarantined as a repeat offender (301 events in 24 h), held for an
    RMA."""
    e = engine()
    booted(e, NODES, 0, 10, "boot-a")
    for node in ("n2", "n3"):
        e.observe(as_batch(GpuXidEvent(node=node, gpu_index=0, uuid=f"{node}-0", xid=79, observed_at=10.0)), 10.0)
    got: list[GpuHealthVerdict] = []
    for t in range(11, 11 + int(CFG.breaker_window_s) + 5):
        got += e.observe(msgspec.structs.replace(batch("n1", float(t), ecc_dbe_volatile=1), boot_id="boot-a"), float(t))
    quarantines = [v for v in got if v.state == HealthState.QUARANTINED]
    assert quarantines, "quarantined once the breaker closed"
    assert not quarantines[0].held
    assert quarantines[0].action != "rma"
    assert len(e.entities[("n1", 0)].fatal_events) == 1


def test_one_batch_missing_a_gpu_is_no_fault() -> None:
    """Found by review: one batch without one of 8 GPUs (an NVML read of that device failed once) quarantined the
    whole node as fatal, interrupting the jobs on all 8 GPUs. A GPU gone is gone in every batch for 10 s."""
    e = engine(gpus=8)
    got: list[GpuHealthVerdict] = []
    for t in range(40):
        for node in NODES:
            got += e.observe(batch(node, float(t), gpus=7 if (node, t) == ("n1", 5) else 8), float(t))
        got += e.tick(t + 0.5)
    assert node_rules(got, "n1") == []
    for t in range(40, 51):  # gone in every batch for 10 s: out
        got += e.observe(batch("n1", float(t), gpus=7), float(t))
    assert node_rules(got, "n1") == [(HealthState.QUARANTINED, "gpu-count-drop")]


@pytest.mark.parametrize("inventory_first", [False, True])
def test_a_node_out_for_a_lost_gpu_stays_out_across_a_restart(inventory_first: bool) -> None:
    """Found by review: a node back from a reboot with 7 of its 8 GPUs was quarantined; the health service restarted,
    rebuilt the expected count from the inventory (7), and the node came back healthy with the GPU still gone."""
    e = engine(gpus=8)
    e.set_inventory("n1", 7, 5.0)
    got = sustained(e, lambda t: batch("n1", t, gpus=7), 6.0)
    (out,) = [v for v in got if v.node == "n1" and v.gpu_index is None]
    assert out.rule == "gpu-count-drop"
    again = HealthEngine(config=CFG)
    if inventory_first:
        again.set_inventory("n1", 7, 20.0)
        again.restore(out)
    else:
        again.restore(out)
        again.set_inventory("n1", 7, 20.0)
    later: list[GpuHealthVerdict] = []
    for t in range(21, 21 + 3 * int(CFG.probation_s)):
        later += again.observe(batch("n1", float(t), gpus=7), float(t)) + again.tick(t + 0.5)
    assert [v.state for v in later if v.node == "n1" and v.gpu_index is None] == []
    assert again.entities[("n1", None)].state == HealthState.QUARANTINED


def test_a_gpu_that_keeps_coming_back_with_a_degraded_fault_is_held() -> None:
    """Found by review: only fatal faults made repeat offenders; a correctable-ECC burst every 30 min made 47
    quarantines (and 47 drains of its jobs) a day. The fifth degraded quarantine in 24 h holds it for an operator."""
    e = engine()
    got: list[GpuHealthVerdict] = []
    sbe = 0
    for t in range(6 * 1800):
        burst = t % 1800 < 3
        sbe += 1000 if burst else 0
        got += e.observe(batch("n1", float(t), ecc_sbe_volatile=sbe), float(t)) + e.tick(t + 0.5)
    quarantines = [v for v in got if v.gpu_index == 0 and v.state == HealthState.QUARANTINED]
    assert len(quarantines) == 5, [(v.observed_at, v.state) for v in got if v.gpu_index == 0]
    assert quarantines[-1].held
    assert "5 quarantines in 24 h" in quarantines[-1].reason
