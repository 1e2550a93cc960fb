"""`chamber bench gateway` runs against the services as processes and reports every figure (the numbers are read by
people, not asserted: this machine is shared)."""

import json

import pytest

from chamber.cli.main import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_bench_gateway_prints_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "gateway", "--seconds", "1", "--preload", "20", "--nodes", "4", "--submit-rate", "50",
            "--connections", "4", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("reads_per_s", "read_p99_ms", "submit_p50_ms", "submit_p99_ms", "gateway_cpu_ms_per_read"):
        assert key in report
    assert report["read_errors"] == 0
    assert report["submit_errors"] == 0
    assert report["submits"] == 50
    assert report["reads_by_path"]["/v1/fleet"] > 0
