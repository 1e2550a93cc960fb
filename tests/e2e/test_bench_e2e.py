"""`chamber bench e2e` runs the services as processes, submits over HTTP with a waiting backlog, and reports where
the CPU went (the numbers are read by people, not asserted: this machine is shared)."""

import json

import pytest

from chamber.cli.main import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_bench_e2e_places_every_submitted_job_and_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "e2e", "--nodes", "4", "--jobs", "60", "--pending", "30", "--clients", "4", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["jobs"] == 60
    assert report["scheduler_waiting_at_end"] == 30  # the backlog waits throughout; every submitted job was placed
    for key in ("submit_per_s", "placed_per_s", "submit_to_placed_p50_ms", "submit_to_placed_p99_ms"):
        assert report[key] > 0
    assert {"gateway", "scheduler", "quota", "loadgen"} <= set(report["cpu_ms_per_job"])
    assert 0 <= report["running_peak"] <= report["pool_gpus"] == 32
    assert {"gateway", "scheduler", "quota", "collector"} <= set(report["peak_rss_mb"])
    assert all(mb > 0 for mb in report["peak_rss_mb"].values())
    assert report["nats_server_version"].count(".") == 2
