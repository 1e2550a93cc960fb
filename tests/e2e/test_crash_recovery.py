"""200 jobs on 16 x 8 simulated GPUs through the real services, with the scheduler killed and restarted halfway
and Redis flushed once: every job finishes exactly once, none is lost, no GPU is ever held by two jobs.

The invariants are judged by the chaos checker (tests/chaos/checker.py), the one checker of recorded histories:
an attempt holds its GPUs until the scheduler released them, not until the finish time its executor reports
(after a restart that report can name a time in the past).
"""

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis

from chamber.cli.infra import free_port
from chamber.common.bus import Bus
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from tests.chaos.checker import Fault, check
from tests.chaos.evidence import collect
from tests.support.processes import ServiceProcesses
from tests.support.services import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

N_JOBS = 200


async def test_two_hundred_jobs_survive_a_scheduler_crash_and_a_redis_flush(
    settings: Settings, cleanup: None, tmp_path: Path
) -> None:
    port = free_port()
    settings = msgspec.structs.replace(
        settings, fleet_nodes=16, gpus_per_node=8, http_port=port, telemetry_interval_s=1.0
    )
    names = Names(settings.namespace)
    procs = ServiceProcesses(settings, tmp_path)
    faults: list[Fault] = []
    for name in ("collector", "scheduler", "health", "quota", "gateway"):
        procs.start(name)
    rng = random.Random(7)
    api = f"http://127.0.0.1:{port}"
    try:
        auth = {"authorization": f"Bearer {settings.admin_token}"}
        async with httpx.AsyncClient(base_url=api, timeout=10, headers=auth) as http:

            async def ready() -> bool:
                try:
                    return bool((await http.get("/v1/fleet")).json()["gpus_total"] == 128)
                except (httpx.HTTPError, ValueError, KeyError):
                    return False

            await eventually(ready, within=30, what="the system is up with 128 GPUs")
            started_at = time.time()
            ids = []
            for i in range(N_JOBS):
                per_replica, replicas = rng.choice([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (4, 2)])
                body = {
                    "name": f"job-{i}",
                    "team": f"team-{i % 5}",
                    "gpus_per_replica": per_replica,
                    "replicas": replicas,
                    "duration_s": round(rng.uniform(0.3, 2.0), 2),
                }
                resp = await http.post("/v1/jobs", json=body)
                assert resp.status_code == 201, resp.text
                ids.append(resp.json()["id"])

            async def succeeded() -> int:
                jobs = (await http.get("/v1/jobs", params={"limit": 1000})).json()
                return sum(j["state"] == "succeeded" for j in jobs)

            await eventually(lambda: _at_least(succeeded, N_JOBS // 4), within=60, what="a quarter done")
            faults.append(Fault("kill", "scheduler", time.time()))
            procs.kill("scheduler")
            await asyncio.sleep(1.0)
            procs.start("scheduler")

            await eventually(lambda: _at_least(succeeded, N_JOBS // 2), within=60, what="half done")
            client = aioredis.Redis.from_url(settings.redis_url)
            keys = [k async for k in client.scan_iter(match=f"{names.redis_prefix()}:*")]
            faults.append(Fault("redis-flush", "", time.time()))
            await client.delete(*keys)  # Redis "restarted" with nothing
            await client.script_flush()
            await client.aclose()

            await eventually(lambda: _at_least(succeeded, N_JOBS), within=120, what="all jobs done")
            jobs = {j["id"]: j for j in (await http.get("/v1/jobs", params={"limit": 1000})).json()}
    except BaseException:
        print(procs.logs())
        await _print_states(settings, names)
        raise
    finally:
        codes = procs.stop_all()
    assert set(jobs) == set(ids), "no job lost, none invented"
    assert all(j["state"] == "succeeded" for j in jobs.values())
    assert all(code == 0 for code in codes.values()), codes

    evidence = await collect(
        settings.nats_url, settings.namespace, accepted=set(ids), faults=faults, gpus_allocated_at_end=None,
        started_at=started_at,
    )  # fmt: skip
    report = check(evidence)
    for claim in ("no_job_lost", "finished_exactly_once", "no_gpu_held_twice"):
        assert report["invariants"][claim]["ok"], json.dumps(report["invariants"][claim], indent=1)
    for job_id in ids:
        gpus = jobs[job_id]["placement"]["gpus"]
        assert len(gpus) == jobs[job_id]["gpus"], "every gang ran whole"


async def _at_least(counter: object, n: int) -> bool:
    return bool(await counter() >= n)  # type: ignore[operator]


async def _print_states(settings: Settings, names: Names) -> None:
    from chamber.common.jobstore import JobStore

    bus = await Bus.connect(settings.nats_url, names, "test")
    records = await (await JobStore.open(bus)).load_all()
    print("KV states:", Counter((r.state, r.placement is not None, r.reason) for r, _ in records.values()))
    await bus.close()
