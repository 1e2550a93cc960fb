"""Fleet metrics and rollups from samples, allocation, health and prices (definitions in docs/metrics.md)."""

import itertools
import math
from collections.abc import Sequence

import msgspec
import numpy as np
import pytest

from chamber.collector.aggregator import Aggregator
from chamber.collector.core.lag import LagHistogram
from chamber.collector.core.metrics import JOBS_REPORTED, Batch, FleetMetrics, PoolPrice, activities, activity, column
from chamber.collector.core.rollups import Rollups
from chamber.collector.core.slots import floats
from chamber.common.codec import encode
from chamber.common.contracts import (
    FleetSnapshot,
    GpuSample,
    GpuXidEvent,
    JobRecord,
    JobState,
    NodeActivityView,
    NodeColumnsActivityView,
    NodeTelemetry,
    TelemetryActivityView,
    to_columns,
)
from chamber.common.metrics_names import METRICS
from tests.support.builders import make_job

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
        (GpuSample(index=0, uuid="x", power_w=50, power_limit_w=700), 0.0),
        (GpuSample(index=0, uuid="x"), math.nan),
        (GpuSample(index=0, uuid="x", power_w=500, power_limit_w=700), math.nan),
    ],
    ids=[
        "busy",
        "under-10%-power-is-idle",
        "sm-activity-preferred",
        "idle-power-alone",
        "nothing-known",
        "busy-power-alone-tells-no-share",
    ],
)
def test_activity(sample: GpuSample, expected: float) -> None:
    assert activity(sample) == pytest.approx(expected, nan_ok=True)


def test_a_gpu_a_job_holds_whose_activity_is_unknown_is_never_counted_idle() -> None:
    """Found by review: a GPU whose source tells no activity (no utilization counters: some virtual GPUs, MIG
    parents) counted as activity 0, so its job was reported as wasting it (allocated-idle hours, idle cost)."""
    m = fleet({"n1": ("h100", 4)})
    silent = [GpuSample(index=i, uuid=f"n1-{i}") for i in range(2)]
    busy = [GpuSample(index=2 + i, uuid=f"n1-{2 + i}", gpu_util=80.0) for i in range(2)]
    m.on_record(holding("opaque", "lab", ("n1", 0)))
    m.on_record(holding("known", "lab", ("n1", 2), ("n1", 3)))
    for t in range(0, 601, 60):
        m.ingest(NodeTelemetry(node="n1", sampled_at=float(t), interval_s=60.0, gpus=silent + busy))
        snap = m.snapshot(float(t))
    assert snap.gpus_healthy == 4
    assert snap.gpus_activity_unknown == 1, "n1/0: held, nothing known; n1/1: held by nobody, so idle"
    assert snap.idle_ratio == pytest.approx(1 / 4), "only the unallocated GPU is idle"
    assert snap.idle_cost_per_hour == pytest.approx(PRICES["h100"].cost_per_gpu_hour)
    known = (0.0 + 0.8 + 0.8) / 3
    assert snap.utilization == pytest.approx(known, abs=1e-4), "over the three GPUs whose activity is known"
    assert snap.efficiency_score == pytest.approx(100 * 1.6 / 3, abs=0.01)
    assert snap.allocated_idle_gpu_hours_by_team == {}
    assert snap.allocated_idle_gpu_hours_by_job == {}


def fleet(inventory: dict[str, tuple[str, int]]) -> FleetMetrics:
    """node -> (pool, GPUs), with the two pools' prices."""
    m = FleetMetrics()
    for price in PRICES.values():
        m.set_price(price)
    for node, (pool, gpus) in inventory.items():
        m.set_inventory(node, pool, range(gpus))
    return m


def holding(job: str, team: str, *gpus: tuple[str, int]) -> JobRecord:
    return make_job(job).team(team).running_on(*gpus).build()


def waiting(job: str, team: str, priority: str) -> JobRecord:
    return make_job(job).team(team).priority(priority).build()


def test_fleet_numbers() -> None:
    m = fleet({"n1": ("h100", 4), "n2": ("a100", 2), "n3": ("a100", 1)})
    m.ingest(batch("n1", [90, 0, 50, 10], power=[600, 40, 400, 300]))
    m.ingest(batch("n2", [0, 0]))
    m.on_record(holding("j1", "nlp", ("n1", 0), ("n1", 2)))
    m.on_record(holding("j2", "vision", ("n1", 1)))
    for record in (waiting("q1", "nlp", "train"), waiting("q2", "nlp", "research"), waiting("q3", "cv", "train")):
        m.on_record(record)
    m.set_cordoned(["n1/3"])
    snap = m.snapshot(100.5)
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
    assert snap.spend_per_hour_by_pool == {"h100": 12.0}
    assert snap.idle_spend_per_hour_by_pool == {"h100": 4.0, "a100": 2.0}
    assert snap.queue_depth == 3
    assert snap.queue_by_team == {"nlp": 2, "cv": 1}
    assert snap.queue_by_priority == {"train": 2, "research": 1}


def test_placements_queue_and_cordons_follow_their_changes() -> None:
    m = fleet({"n1": ("h100", 2)})
    m.ingest(batch("n1", [90, 90]))
    m.on_record(waiting("j", "nlp", "train"))
    assert (m.snapshot(100.0).queue_depth, m.snapshot(100.0).gpus_allocated) == (1, 0)
    m.on_record(holding("j", "nlp", ("n1", 0), ("n1", 1)))
    snap = m.snapshot(100.0)
    assert (snap.queue_depth, snap.gpus_allocated, snap.queue_by_team) == (0, 2, {})
    m.on_record(msgspec.structs.replace(holding("j", "nlp", ("n1", 0)), state=JobState.SUCCEEDED))
    assert m.snapshot(100.0).gpus_allocated == 0, "a finished job holds nothing, whatever its placement says"
    m.set_cordoned(["n1/0"])
    assert m.snapshot(100.0).gpus_healthy == 1
    m.set_cordoned([])
    assert m.snapshot(100.0).gpus_healthy == 2


def test_a_sample_goes_stale_after_three_intervals() -> None:
    m = fleet({"n1": ("h100", 1)})
    m.ingest(batch("n1", [50.0], at=100.0))
    assert m.snapshot(103.0).gpus_reporting == 1
    assert m.snapshot(103.5).gpus_reporting == 0


def test_allocated_but_idle_gpu_hours_accumulate_per_team_and_job() -> None:
    m = fleet({"n1": ("h100", 1)})
    m.on_record(holding("notebook", "lab", ("n1", 0)))
    for t in range(0, 3601, 60):
        m.ingest(batch("n1", [0.0], at=float(t)))
        snap = m.snapshot(float(t))
    assert snap.allocated_idle_gpu_hours_by_team["lab"] == pytest.approx(1.0)
    assert snap.allocated_idle_gpu_hours_by_job["notebook"] == pytest.approx(1.0)


def test_a_write_of_a_running_jobs_record_keeps_its_idle_hours() -> None:
    """Found by review: every write of a record (a reason, a counter) reset the job's idle hours to zero."""
    m = fleet({"n1": ("h100", 1)})
    record = holding("notebook", "lab", ("n1", 0))
    m.on_record(record)
    for t in range(0, 1801, 60):
        m.ingest(batch("n1", [0.0], at=float(t)))
        m.snapshot(float(t))
    m.on_record(msgspec.structs.replace(record, updated_at=1800.0, run_s=5.0))
    m.ingest(batch("n1", [0.0], at=1860.0))
    snap = m.snapshot(1860.0)
    assert snap.allocated_idle_gpu_hours_by_job["notebook"] == pytest.approx(31 / 60, abs=1e-3)  # (rounded)


def test_the_per_job_idle_hours_stay_bounded() -> None:
    """Only jobs holding GPUs now are listed, at most JOBS_REPORTED of them, the idlest first."""
    gpus = JOBS_REPORTED + 50
    m = fleet({"n1": ("h100", gpus)})
    for i in range(gpus):
        m.on_record(holding(f"j{i:03d}", "lab", ("n1", i)))
    for t in (0.0, 10.0):
        m.ingest(batch("n1", [0.0] * gpus, at=t))
        m.snapshot(t)
    m.ingest(batch("n1", [0.0] * 10 + [90.0] * (gpus - 10), at=20.0))
    snap = m.snapshot(20.0)
    listed = snap.allocated_idle_gpu_hours_by_job
    assert len(listed) == JOBS_REPORTED
    assert set(list(listed)[:10]) == {f"j{i:03d}" for i in range(10)}, "idle for 20 s, the others for 10 s"
    for i in range(10):
        m.on_record(msgspec.structs.replace(holding(f"j{i:03d}", "lab", ("n1", i)), state=JobState.SUCCEEDED))
    m.ingest(batch("n1", [0.0] * gpus, at=30.0))
    listed = m.snapshot(30.0).allocated_idle_gpu_hours_by_job
    assert not {f"j{i:03d}" for i in range(10)} & set(listed), "finished jobs leave the list"
    assert m.snapshot(30.0).allocated_idle_gpu_hours_by_team["lab"] > 0, "the team keeps its total"
    assert len(m.jobs.ids) == gpus - 10


def test_garbage_gpu_indices_are_ignored() -> None:
    m = fleet({"n1": ("h100", 1)})
    m.ingest(NodeTelemetry(node="n1", sampled_at=100.0, interval_s=1.0,
                           gpus=[GpuSample(index=-1, uuid="x"), GpuSample(index=10**9, uuid="y")]))  # fmt: skip
    assert len(m.slots) == 1


def test_the_lean_view_reads_what_the_full_sample_says() -> None:
    full = batch("n1", [90, 0, 50], power=[600, 40, 400])
    view = msgspec.json.decode(encode(full), type=TelemetryActivityView)
    assert isinstance(view, NodeActivityView)
    assert [activity(s) for s in view.gpus] == [activity(s) for s in full.gpus]
    assert (view.node, view.sampled_at, view.interval_s) == (full.node, full.sampled_at, full.interval_s)


def test_lag_quantiles() -> None:
    lag = LagHistogram()
    lag.add([5.2, 250.0, 999.0], [98, 1, 1])
    assert lag.total == 100
    assert lag.quantile(0.5) == 6.0
    assert lag.quantile(0.99) == 251.0
    assert lag.quantile(1.0) == 1000.0


def test_rollups_average_each_bucket() -> None:
    r = Rollups()
    closed = []
    for t in range(0, 180, 10):
        closed += r.add(float(t), {"utilization": 1.0 if t < 60 else 0.0, "gpus_healthy": 8})
    minute = [p for p in closed if p.resolution == "1m"]
    assert [p.start for p in minute] == [0.0, 60.0]
    assert minute[0].values["utilization"] == 1.0
    assert minute[1].values["utilization"] == 0.0
    series = r.series("utilization", "1m", since=0)
    assert len(series) == 3, "two finished minutes and the open one"


def test_a_rollup_of_a_ratio_is_the_ratio_of_the_gpu_time_not_the_mean_of_the_ratios() -> None:
    """Found by review: a bucket's idle_ratio was the mean of its snapshots' ratios, so a minute with the fleet half
    cordoned counted as much as one with all of it (docs/metrics.md: idle GPU-time over healthy GPU-time)."""
    r = Rollups()
    whole = {
        "idle_ratio": 0.5,
        "allocation_ratio": 0.5,
        "utilization": 0.5,
        "efficiency_score": 50.0,
        "gpus_healthy": 1000,
        "gpus_activity_unknown": 0,
        "queue_depth": 10,
    }
    half = {"idle_ratio": 1.0, "allocation_ratio": 0.0, "utilization": 0.1, "efficiency_score": 0.0,
            "gpus_healthy": 500, "gpus_activity_unknown": 100, "queue_depth": 30}  # fmt: skip
    r.add(0.0, whole)
    r.add(30.0, half)
    (point,) = [p for p in r.add(60.0, whole) if p.resolution == "1m"]
    assert point.values["idle_ratio"] == pytest.approx((500 + 500) / 1500)
    assert point.values["allocation_ratio"] == pytest.approx(500 / 1500)
    assert point.values["utilization"] == pytest.approx((0.5 * 1000 + 0.1 * 400) / 1400)
    assert point.values["efficiency_score"] == pytest.approx(50.0 * 1000 / 1400)
    assert point.values["queue_depth"] == 20.0, "a count is the plain mean"
    assert point.values["gpus_healthy"] == 750.0
    assert r.series("idle_ratio", "1m", since=60.0) == [(60.0, 0.5)], "the open bucket, weighted alike"
    empty = Rollups()
    empty.add(0.0, {"idle_ratio": 0.0, "gpus_healthy": 0})
    assert empty.series("idle_ratio", "1m", since=0.0) == [(0.0, 0.0)], "no healthy GPU: 0, not a division by 0"


def test_a_collector_restarted_keeps_its_hour_and_day_from_the_minutes_it_published() -> None:
    """Found by review: the open hour's and day's rollups lived only in memory, so the day's point after a restart
    at 18:00 was the mean of its last six hours. Restarted at a minute's turn, the hour and the day come out as if
    nothing had happened (the minute open at a restart is lost: at most one)."""
    import random

    rng = random.Random(7)

    def snapshot() -> dict[str, float]:
        healthy = rng.randrange(500, 1001)
        unknown = rng.randrange(0, 50)
        return {"utilization": rng.random(), "allocation_ratio": rng.random(), "idle_ratio": rng.random(),
                "efficiency_score": 100 * rng.random(), "queue_depth": rng.randrange(100), "gpus_healthy": healthy,
                "gpus_allocated": rng.randrange(healthy), "gpus_activity_unknown": unknown}  # fmt: skip

    day0 = 86400.0 * 20_000
    times = [day0 + 3600 * 5 + 15 * i for i in range(4 * 60 * 3)]  # three hours, a snapshot every 15 s
    values = [snapshot() for _ in times]
    once, before = Rollups(), Rollups()
    closed_once = [p for t, v in zip(times, values, strict=True) for p in once.add(t, v)]
    restart = day0 + 3600 * 6 + 60 * 17  # 06:17:00, in the second hour
    published = [p for t, v in zip(times, values, strict=True) if t < restart for p in before.add(t, v)]
    after = Rollups()
    assert after.restore([p for p in published if p.resolution == "1m"], restart) == 60 + 17 - 1, (
        "the minutes of the day so far, but the last one: it closes only with the next snapshot (lost)"
    )
    closed_after = [p for t, v in zip(times, values, strict=True) if t >= restart for p in after.add(t, v)]
    minute_lost = restart - 60
    kept = [v for t, v in zip(times, values, strict=True) if not minute_lost <= t < restart]
    expect = Rollups()
    expected = [p for t, v in zip([t for t in times if not minute_lost <= t < restart], kept, strict=True)
                for p in expect.add(t, v)]  # fmt: skip
    hours = {p.start: p for p in closed_after if p.resolution == "1h"}
    for point in (p for p in expected if p.resolution == "1h" and p.start in hours):
        for k in METRICS:
            assert hours[point.start].values[k] == pytest.approx(point.values[k]), (point.start, k)
        assert hours[point.start].samples == point.samples
    assert day0 + 3600 * 6 in hours, "the hour of the restart, whole but its lost minute"
    for k in ("idle_ratio", "utilization", "queue_depth"):
        ((got_start, got),) = after.series(k, "1d", since=day0)
        ((want_start, want),) = expect.series(k, "1d", since=day0)
        assert got_start == want_start
        assert got == pytest.approx(want), k
    assert len(closed_once) > len(closed_after)


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


def test_the_last_xid_an_nvml_agent_reports_as_an_event_is_exported_as_dcgm_exporter_does() -> None:
    """Found by review: a node agent reports XIDs as events the moment NVML's event set has them (not in its
    samples), and the aggregator dropped the events: `DCGM_FI_DEV_XID_ERRORS`, which dcgm-exporter users alert on,
    was never exported for real GPUs."""
    from chamber.collector.prometheus import ChamberCollector
    from chamber.common.codec import encode

    metrics = fleet({"n1": ("h100", 2)})
    agg = Aggregator.__new__(Aggregator)
    agg.metrics, agg.rejected = metrics, 0
    xid = GpuXidEvent(node="n1", gpu_index=1, uuid="n1-1", xid=79, observed_at=100.0)
    agg._on_payloads([encode(batch("n1", [50.0, 60.0], at=100.0)), encode(xid)])
    scrape = ChamberCollector(metrics, lambda node, index: "H100", lambda: None)

    def exported() -> dict[str, float]:
        family = next(f for f in scrape.collect() if f.name == "DCGM_FI_DEV_XID_ERRORS")
        return {s.labels["gpu"]: s.value for s in family.samples}

    assert exported() == {"1": 79.0}
    agg._on_payloads([encode(batch("n1", [50.0, 60.0], at=101.0))])
    assert exported() == {"1": 79.0}, "the last XID is kept, as dcgm-exporter keeps it"
    metrics.ingest(NodeTelemetry(node="n1", sampled_at=102.0, interval_s=1.0,
                                 gpus=[GpuSample(index=0, uuid="n1-0", xids=[13]),
                                       GpuSample(index=1, uuid="n1-1", gpu_util=60.0)]))  # fmt: skip
    assert exported() == {"0": 13.0, "1": 79.0}, "a source that puts XIDs in its samples is exported as before"


def test_gpu_usage_and_unallocated_processes_are_exported_per_gpu() -> None:
    from chamber.collector.prometheus import ChamberCollector

    metrics = FleetMetrics()
    rogue = GpuSample(index=0, uuid="GPU-a", usage=71.25, unallocated_processes=2)
    unknown = GpuSample(index=1, uuid="GPU-b")
    metrics.ingest(NodeTelemetry(node="n1", sampled_at=1.0, interval_s=1.0, gpus=[rogue, unknown]))
    families = {f.name: f for f in ChamberCollector(metrics, lambda node, index: "H100", lambda: None).collect()}
    (sample,) = families["chamber_gpu_unallocated_processes"].samples
    assert sample.value == 2.0
    assert sample.labels["UUID"] == "GPU-a", "a GPU whose source cannot tell has no value (not 0)"
    assert [s.value for s in families["chamber_gpu_usage"].samples] == [71.25]
    assert activity(rogue) == pytest.approx(0.7125), "fleet activity follows the GPU's usage"


def test_a_node_that_stopped_reporting_leaves_the_metrics_endpoint() -> None:
    """Found by review: a node's last batch was exported for ever after it stopped reporting (removed, its agent
    gone), with its last utilization and power, while the fleet figures had long left it out."""
    from chamber.collector.prometheus import ChamberCollector

    metrics = fleet({"n1": ("h100", 1), "n2": ("h100", 1)})
    snap: list[FleetSnapshot] = []
    scrape = ChamberCollector(metrics, lambda node, index: "H100", lambda: snap[-1] if snap else None)

    def exported() -> set[str]:
        families = {f.name: f for f in scrape.collect()}
        return {s.labels["Hostname"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}

    metrics.ingest(batch("n1", [50.0], at=100.0))
    metrics.ingest(batch("n2", [70.0], at=100.0))
    assert exported() == {"n1", "n2"}, "before the first snapshot: all"
    snap.append(metrics.snapshot(101.0))
    assert exported() == {"n1", "n2"}
    metrics.ingest(batch("n1", [50.0], at=103.0))
    snap.append(metrics.snapshot(103.5))
    assert snap[-1].gpus_reporting == 1
    assert exported() == {"n1"}, "n2 is stale after three intervals, as in the fleet figures"
    metrics.ingest(batch("n2", [70.0], at=104.0))
    snap.append(metrics.snapshot(104.0))
    assert exported() == {"n1", "n2"}, "back once it reports again"


def test_activities_of_many_samples_match_activity_of_each() -> None:
    values = [None, 0.0, 5.0, 50.0, 120.0, -3.0]
    grid = [
        GpuSample(index=0, uuid="x", usage=u, power_w=p, power_limit_w=lim, sm_activity=sm, gpu_util=g)
        for u, p, lim, sm, g in itertools.product(
            [None, 40.0, 150.0], [None, 20.0, 600.0], [None, 0.0, 700.0], [None, 0.0, 0.4, 1.5], values
        )
    ]
    got = activities(*(column([getattr(s, f) for s in grid]) for f in
                       ("usage", "power_w", "power_limit_w", "sm_activity", "gpu_util")))  # fmt: skip
    assert got.tolist() == pytest.approx([activity(s) for s in grid], nan_ok=True)


def test_columns_rows_and_full_batches_ingest_alike() -> None:
    batches = [
        batch("n1", [90, 0, 50], at=10.0, power=[600, 40, 400]),
        batch("n2", [10, 20], at=11.0),
        NodeTelemetry(node="n3", sampled_at=12.0, interval_s=2.0,
                      gpus=[GpuSample(index=5, uuid="a", usage=30.0), GpuSample(index=2, uuid="b", sm_activity=0.7)]),
        batch("n1", [10, 10, 10], at=13.0),
    ]  # fmt: skip
    as_rows = [msgspec.json.decode(encode(b), type=NodeActivityView) for b in batches]
    as_columns = [msgspec.json.decode(encode(to_columns(b)), type=NodeColumnsActivityView) for b in batches]
    results = []
    forms: list[Sequence[Batch]] = [batches, as_rows, as_columns]
    for form in forms:
        m = fleet({"n1": ("h100", 3), "n2": ("h100", 2)})
        m.ingest_many((b, None) for b in form)
        cols = m.slots.cols
        by_key = {k: (floats(cols.activity)[i], floats(cols.seen_at)[i]) for i, k in enumerate(m.slots.keys)}
        results.append((by_key, m.samples, m.take_reported()))
    assert results[0] == results[1] == results[2]
    by_key, samples, (times, gpus) = results[2]
    assert by_key["n1/0"] == (pytest.approx(0.1), 13.0), "the later batch of a node wins"
    assert by_key["n3/5"] == (pytest.approx(0.3), 12.0)
    assert by_key["n3/2"] == (pytest.approx(0.7), 12.0)
    assert (samples, times, gpus) == (10, [10.0, 11.0, 12.0, 13.0], [3, 2, 2, 3])


def test_a_column_absent_on_every_gpu_counts_as_none() -> None:
    m = fleet({"n1": ("h100", 2)})
    raw = encode(to_columns(batch("n1", [80, 30], power=[500, 10])))
    m.ingest_many([(msgspec.json.decode(raw, type=NodeColumnsActivityView), raw)])
    assert np.allclose(floats(m.slots.cols.activity)[:2], [0.8, 0.0])


def test_every_fleet_figure_the_docs_define_is_exported() -> None:
    """Found by review: `gpus_reporting`, defined in docs/metrics.md and in the fleet snapshot, was not exported."""
    from chamber.collector.prometheus import FLEET_GAUGES

    exported = {f for f, _ in FLEET_GAUGES}
    numbers = {name for name, kind in FleetSnapshot.__annotations__.items() if kind in (int, float, "int", "float")}
    assert {"gpus_total", "gpus_reporting", "gpus_healthy", "gpus_allocated"} <= exported
    assert {"gpus_reporting"} <= numbers
