"""The README's first command: `chamber up` on embedded servers, a job submitted over HTTP, Ctrl-C."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from chamber.cli.infra import free_port, nats_answers, redis_answers, resolve

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_embedded_servers_start_and_stop() -> None:
    infra = resolve(env={}, allow_local=False)
    try:
        assert infra.origin == {"nats": "embedded", "redis": "embedded"}
        assert nats_answers(infra.nats_url)
        assert redis_answers(infra.redis_url)
        tmp = infra.tmpdir
    finally:
        infra.stop()
    assert not nats_answers(infra.nats_url)
    assert tmp is not None
    assert not Path(tmp).exists(), "the temporary data is removed"


def test_chamber_up_runs_a_job_end_to_end(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
        "CHAMBER_EMBEDDED": "1",
        "CHAMBER_HTTP_PORT": str(port),
        "CHAMBER_METRICS_PORT": "0",
        "CHAMBER_GRPC_PORT": "0",
        "CHAMBER_ADMIN_TOKEN": "e2e-admin-token",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "up.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "up"], env=env, stdout=out, stderr=out)
    try:
        deadline = started + 30
        while b"chamber: ready in" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "not ready within 30 s:\n" + log.read_text()
            time.sleep(0.1)
        auth = {"authorization": "Bearer e2e-admin-token"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5, headers=auth) as http:
            while http.get("/v1/fleet").json()["gpus_total"] == 0:
                assert time.monotonic() < deadline, "inventory did not arrive"
                time.sleep(0.1)
            job = http.post("/v1/jobs", json={"name": "hello", "team": "demo", "gpus_per_replica": 8, "duration_s": 2})
            assert job.status_code == 201, job.text
            job_id = job.json()["id"]
            submitted = time.monotonic()
            while http.get(f"/v1/jobs/{job_id}").json()["state"] != "running":
                assert time.monotonic() - submitted < 2.0, "not running within 2 s"
                time.sleep(0.05)
            while http.get(f"/v1/jobs/{job_id}").json()["state"] != "succeeded":
                assert time.monotonic() - submitted < 10.0, "not succeeded after its duration"
                time.sleep(0.1)
            assert time.monotonic() - submitted >= 2.0
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
