"""With NATS down, the gateway answers at once with 503 and `Retry-After` (it used to wait out nats-py's 5 s
timeouts and answer 500). NATS here is an embedded nats-server of the test's own, killed mid-test."""

import time
from pathlib import Path

import msgspec
import pytest

from chamber.cli.infra import embedded_nats
from chamber.common.settings import Settings
from tests.support.gateway import gateway_client

pytestmark = pytest.mark.integration

JOB = {"name": "a", "team": "ml", "gpus_per_replica": 1}


async def test_nats_down_is_a_fast_503_with_retry_after(settings: Settings, tmp_path: Path) -> None:
    nats = embedded_nats(tmp_path)
    nats.start()
    url = nats.url
    try:
        async with gateway_client(msgspec.structs.replace(settings, nats_url=url)) as client:
            job = await client.post("/v1/jobs", json=JOB)
            assert job.status_code == 201
            nats.kill()
            deadline = time.monotonic() + 5
            while (await client.get("/healthz")).status_code != 503:
                assert time.monotonic() < deadline, "the gateway did not notice NATS went away"
            one = f"/v1/jobs/{job.json()['id']}"
            calls = [("POST", "/v1/jobs", JOB), ("GET", "/v1/jobs", None), ("GET", one, None), ("DELETE", one, None),
                     ("GET", "/v1/fleet", None), ("GET", "/v1/teams", None), ("GET", "/v1/audit", None)]  # fmt: skip
            for method, path, body in calls:
                started = time.monotonic()
                resp = await client.request(method, path, json=body)
                took = time.monotonic() - started
                assert resp.status_code == 503, (method, path, resp.text)
                assert resp.headers["retry-after"] == "2"
                assert resp.headers["content-type"].startswith("application/problem+json")
                assert "NATS" in resp.json()["detail"]
                assert took < 1.0, f"{method} {path} took {took:.1f} s"
    finally:
        nats.kill()
