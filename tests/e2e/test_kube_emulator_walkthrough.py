"""docs/kubernetes.md's walk-through: `chamber up --kube-emulator`, then the example Job made with the official
client is suspended, admitted, bound, run and finished, and Chamber's API says so."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chamber.cli.infra import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "kube_job.py"
TOKEN = "walkthrough-admin-token-0123456789"


def test_chamber_up_with_the_kube_emulator_runs_an_ordinary_job(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
        "CHAMBER_EMBEDDED": "1", "CHAMBER_HTTP_PORT": str(port), "CHAMBER_METRICS_PORT": "0",
        "CHAMBER_FLEET_NODES": "4", "PYTHONUNBUFFERED": "1", "CHAMBER_ADMIN_TOKEN": TOKEN,
    }  # fmt: skip
    log = tmp_path / "up.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        cmd = [sys.executable, "-m", "chamber.cli.main", "up", "--kube-emulator"]
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=out)
    try:
        while b"chamber: ready in" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() - started < 60, "not ready within 60 s:\n" + log.read_text()
            time.sleep(0.1)
        found = re.search(r"emulated Kubernetes API at (http://\S+)", log.read_text())
        assert found, log.read_text()
        example = subprocess.run(
            [sys.executable, str(EXAMPLE), found.group(1), "--chamber", f"http://127.0.0.1:{port}", "--seconds", "2",
             "--token", TOKEN],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        said = example.stdout
        assert example.returncode == 0, said + example.stderr + log.read_text()[-4000:]
        assert "suspend=True, schedulerName=chamber" in said, "the webhook suspended it and set the scheduler"
        assert re.search(r"pods=\[\S+@node-\d+:Running", said), "its pod was bound and ran"
        assert "chamber=succeeded" in said
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()[-4000:]
