"""The scheduler benchmark runs and reports every figure (its numbers are read by people, not asserted)."""

import json

from chamber.cli.main import main


def test_bench_scheduler_prints_one_json_object(capsys: object) -> None:
    assert main(["bench", "scheduler", "--nodes", "16", "--pending", "500", "--cycles", "5", "--json"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    report = json.loads(out)
    for key in ("placements_per_s", "arrival_p50_ms", "arrival_p99_ms", "preemption_plan_p99_ms", "peak_rss_mb"):
        assert key in report
    assert report["initial_fill_placements"] > 0


def test_bench_quota_prints_one_json_object(capsys: object) -> None:
    assert main(["bench", "quota", "--teams", "50", "--pools", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert {"recompute_ms", "admission_check_us"} <= set(report)


def test_bench_quota_reports_the_service_update(capsys: object) -> None:
    assert main(["bench", "quota", "--teams", "40", "--pools", "2", "--jobs", "2000", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    assert {"service_update_ms", "service_update_p99_ms", "publish_ms", "from_scratch_ms"} <= set(report)
    assert report["teams_reported"] == 40


def test_bench_telemetry_prints_one_json_object(capsys: object) -> None:
    args = ["bench", "telemetry", "--gpus", "800", "--rounds", "2", "--seconds", "2", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)  # type: ignore[attr-defined]
    for key in ("samples_per_s", "samples_per_cpu_s", "snapshot_ms_p99", "sample_to_metric_p99_ms"):
        assert key in report
    assert report["snapshot_gpus_total"] == 800, "every distinct GPU is in the snapshot"
    assert report["flood_samples"] == 800 * 2
    assert report["lag_samples"] > 0
