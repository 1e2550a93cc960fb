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
