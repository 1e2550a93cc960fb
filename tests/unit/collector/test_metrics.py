"""Fleet metrics and rollups from samples, allocation, health and prices (definitions in docs/metrics.md)."""

import pytest

from chamber.collector.core.metrics import FleetMetrics, PoolPrice, activity
from chamber.collector.core.rollups import Rollups
from chamber.common.contracts import GpuSample, NodeTelemetry

PRICES = {"h100": PoolPrice("h100", "aws", 4.0), "a100": PoolPrice("a100", "onprem", 1.0)}


def batch(node: str, utils: list[float], at: float = 100.0, power: list[float] | None = None) -> NodeTelemetry:
    gpus = [
        GpuSample(index=i, uuid=f"{node}-{i}", gpu_util=u, power_w=(power or [400.0] * len(utils))[i],
                  power_limit_w=700.0)
        for i, u in enumerate(utils)
    ]  # fmt: skip
    return NodeTelemetry(node=node, sampled_at=at, interval_s=1.0, gpus=gpus)


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        (GpuSample(index=0, uuid="x", gpu_util=80.0, power_w=500, power_limit_w=700), 0.8),
        (GpuSample(index=0, uuid="x", gpu_util=80.0, power_w=50, power_limit_w=700), 0.0),
        (GpuSample(index=0, uuid="x", gpu_util=80.0, sm_activity=0.3), 0.3),
        (GpuSample(index=0, uuid="x"), 0.0),
    ],
    ids=["busy", "under-10%-power-is-idle", "sm-activity-preferred", "nothing-known"],
)
def test_activity(sample: GpuSample, expected: float) -> None:
    assert activity(sample) == pytest.approx(expected)


def test_fleet_numbers() -> None:
    m = FleetMetrics()
    m.ingest(batch("n1", [90, 0, 50, 10], power=[600, 40, 400, 300]))
    m.ingest(batch("n2", [0, 0]))
    inventory = [(f"n1/{i}", "h100") for i in range(4)] + [("n2/0", "a100"), ("n2/1", "a100"), ("n3/0", "a100")]
    allocation = {"n1/0": ("j1", "nlp"), "n1/1": ("j2", "vision"), "n1/2": ("j1", "nlp")}
    snap = m.snapshot(100.5, inventory=inventory, allocation=allocation, cordoned=["n1/3"], prices=PRICES,
                      queue=[("nlp", "train"), ("nlp", "research"), ("cv", "train")])  # fmt: skip
    assert snap.gpus_total == 7
    assert snap.gpus_reporting == 6, "n3 never reported"
    assert snap.gpus_healthy == 5, "n1/3 is cordoned, n3/0 is silent"
    assert snap.gpus_allocated == 3
    assert snap.allocation_ratio == pytest.approx(3 / 5)
    assert snap.utilization == pytest.approx((0.9 + 0.5) / 5)
    assert snap.idle_ratio == pytest.approx(3 / 5), "n1/1 allocated but idle, n2/0 and n2/1 unallocated"
    assert snap.efficiency_score == pytest.approx(100 * 1.4 / 5)
    assert snap.spend_per_hour == pytest.approx(12.0)
    assert snap.idle_cost_per_hour == pytest.approx(4.0 + 1.0 + 1.0)
    assert snap.spend_per_hour_by_cloud == {"aws": 12.0}
    assert snap.queue_depth == 3
    assert snap.queue_by_team == {"nlp": 2, "cv": 1}


def test_allocated_but_idle_gpu_hours_accumulate_per_team_and_job() -> None:
    m = FleetMetrics()
    inventory = [("n1/0", "h100")]
    allocation = {"n1/0": ("notebook", "lab")}
    for t in range(0, 3601, 60):
        m.ingest(batch("n1", [0.0], at=float(t)))
        snap = m.snapshot(float(t), inventory=inventory, allocation=allocation, cordoned=[], prices=PRICES, queue=[])
    assert snap.allocated_idle_gpu_hours_by_team["lab"] == pytest.approx(1.0)
    assert snap.allocated_idle_gpu_hours_by_job["notebook"] == pytest.approx(1.0)


def test_rollups_average_each_bucket() -> None:
    r = Rollups()
    closed = []
    for t in range(0, 180, 10):
        closed += r.add(float(t), {"utilization": 1.0 if t < 60 else 0.0})
    minute = [p for p in closed if p.resolution == "1m"]
    assert [p.start for p in minute] == [0.0, 60.0]
    assert minute[0].values["utilization"] == 1.0
    assert minute[1].values["utilization"] == 0.0
    series = r.series("utilization", "1m", since=0)
    assert len(series) == 3, "two finished minutes and the open one"


def test_the_grafana_dashboard_only_uses_metrics_we_export() -> None:
    import json
    import re
    from pathlib import Path

    from chamber.collector.prometheus import DCGM_FIELDS, FLEET_GAUGES

    exported = {name for name, _, _ in DCGM_FIELDS} | {f"chamber_fleet_{f}" for f, _ in FLEET_GAUGES} | {
        "chamber_queue_depth_by_team", "chamber_queue_depth_by_priority", "chamber_spend_per_hour_by_pool",
        "chamber_idle_spend_per_hour_by_pool", "chamber_spend_per_hour_by_cloud",
        "chamber_allocated_idle_gpu_hours_by_team",
    }  # fmt: skip
    dash = json.loads((Path(__file__).parents[3] / "deploy" / "grafana" / "chamber-fleet.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"\b(?:DCGM|chamber)_\w+", t["expr"])}
    assert used, "the dashboard queries something"
    assert used <= exported, used - exported


def test_gpu_usage_and_unallocated_processes_are_exported_per_gpu() -> None:
    from chamber.collector.prometheus import ChamberCollector

    metrics = FleetMetrics()
    rogue = GpuSample(index=0, uuid="GPU-a", usage=71.25, unallocated_processes=2)
    unknown = GpuSample(index=1, uuid="GPU-b")
    metrics.ingest(NodeTelemetry(node="n1", sampled_at=1.0, interval_s=1.0, gpus=[rogue, unknown]))
    families = {f.name: f for f in ChamberCollector(metrics, lambda slot: "H100", lambda: None).collect()}
    (sample,) = families["chamber_gpu_unallocated_processes"].samples
    assert sample.value == 2.0
    assert sample.labels["UUID"] == "GPU-a", "a GPU whose source cannot tell has no value (not 0)"
    assert [s.value for s in families["chamber_gpu_usage"].samples] == [71.25]
    assert activity(rogue) == pytest.approx(0.7125), "fleet activity follows the GPU's usage"
