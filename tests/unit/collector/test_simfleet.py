"""The simulated fleet: activity follows the jobs on each GPU; injected faults show in the samples."""

import pytest

from chamber.collector.core.simfleet import FleetShape, PoolShape, SimulatedFleet

SHAPE = FleetShape(nodes=2, gpus_per_node=2, interval_s=1.0)


def gpu(fleet: SimulatedFleet, now: float, allocation: dict[str, str], node: str, index: int):
    batch = next(b for b in fleet.sample(now, allocation) if b.node == node)
    return batch.gpus[index]


def test_free_gpus_idle_busy_gpus_work_and_notebooks_hold_idle() -> None:
    fleet = SimulatedFleet(SHAPE, seed=1)
    notebook = next(f"nb{i}" for i in range(100) if __import__("zlib").crc32(f"nb{i}".encode()) % 10 == 0)
    trainer = next(f"tr{i}" for i in range(100) if __import__("zlib").crc32(f"tr{i}".encode()) % 10 != 0)
    alloc = {"node-0000/0": trainer, "node-0000/1": notebook}
    utils = [gpu(fleet, t, alloc, "node-0000", 0).gpu_util for t in range(60)]
    assert max(utils) >= 70
    assert min(utils) < 15, "data-loading dips"
    assert gpu(fleet, 0, alloc, "node-0000", 1).gpu_util == 0.0
    assert gpu(fleet, 0, alloc, "node-0001", 0).gpu_util == 0.0


def test_busy_gpus_report_the_power_cap_as_real_ones_do_and_health_sees_no_fault() -> None:
    """A healthy fleet at work sets the SW power cap (an H200 did at 659 of 700 W) and idle GPUs set GPU idle:
    a minute of it marks no GPU suspect."""
    from chamber.health.core.engine import HealthEngine

    fleet = SimulatedFleet(SHAPE, seed=1)
    trainer = next(f"tr{i}" for i in range(100) if __import__("zlib").crc32(f"tr{i}".encode()) % 10 != 0)
    alloc = {"node-0000/0": trainer, "node-0000/1": trainer, "node-0001/0": trainer}
    engine = HealthEngine()
    verdicts = []
    reasons = set()
    for t in range(60):
        batches = fleet.sample(float(t), alloc)
        reasons |= {g.clock_event_reasons for b in batches for g in b.gpus}
        for b in batches:
            verdicts += engine.observe(b, float(t))
    assert reasons >= {0x01, 0x04}, "GPU idle on free GPUs, the SW power cap on the busiest"
    assert verdicts == [], "working at the power limit is no fault"


def test_pools_have_their_models_and_prices() -> None:
    shape = FleetShape(gpus_per_node=8, pools=(PoolShape("h100", "H100", 2, 4.0), PoolShape("a100", "A100", 3, 1.5)))
    inv = SimulatedFleet(shape).inventory(0)
    assert [i.pool.name for i in inv] == ["h100", "h100", "a100", "a100", "a100"]
    assert inv[3].node.gpus[0].model == "A100"
    assert inv[3].pool.cost_per_gpu_hour == 1.5


@pytest.mark.parametrize(
    ("kind", "value", "check"),
    [
        ("xid", 79, lambda s: s.xids == [79]),
        ("dbe", 0, lambda s: s.ecc_dbe_volatile == 1),
        ("row_remap_failure", 0, lambda s: s.remapped_rows_failure is True),
        ("nvlink_replay", 50, lambda s: s.nvlink_replay_errors == 50),
        ("thermal", 0, lambda s: s.temperature_c == 95.0 and s.clock_event_reasons),
    ],
)
def test_injected_faults_show(kind: str, value: int, check) -> None:
    fleet = SimulatedFleet(SHAPE)
    fleet.inject("node-0001", 1, kind, value=value)
    assert check(gpu(fleet, 1.0, {}, "node-0001", 1))
    assert gpu(fleet, 1.0, {}, "node-0001", 0).ecc_dbe_volatile == 0, "only the faulty GPU"


def test_an_xid_is_reported_once_and_a_silent_node_sends_nothing() -> None:
    fleet = SimulatedFleet(SHAPE)
    fleet.inject("node-0000", 0, "xid", value=48)
    assert gpu(fleet, 1, {}, "node-0000", 0).xids == [48]
    assert gpu(fleet, 2, {}, "node-0000", 0).xids == []
    fleet.inject("node-0001", None, "heartbeat_loss")
    assert [b.node for b in fleet.sample(3, {})] == ["node-0000"]
    with pytest.raises(ValueError, match="unknown fault"):
        fleet.inject("node-0000", 0, "gremlins")
