"""200 jobs on 16 x 8 simulated GPUs through the real services, with the scheduler killed and restarted halfway
and Redis flushed once: every job finishes exactly once, none is lost, no GPU is ever held by two jobs."""

import asyncio
import itertools
import random
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis

from chamber.cli.infra import free_port
from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import Decision, JobEvent, JobFinished, JobPlaced, JobStateChanged
from chamber.common.settings import Settings
from chamber.common.subjects import DECISIONS, JOBS, Names
from tests.support.processes import ServiceProcesses
from tests.support.services import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

N_JOBS = 200


async def read_stream(bus: Bus, stream: str, decoder: Decoder) -> list[object]:
    """Every message of a stream, decoded, in order."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    info = await bus.js.stream_info(stream)
    psub = await bus.js.pull_subscribe(
        ">", stream=stream, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
    )
    out: list[object] = []
    while len(out) < info.state.messages:
        for msg in await psub.fetch(1000, timeout=5):
            out.append(decoder.decode(msg.data))
    await psub.unsubscribe()
    return out


async def test_two_hundred_jobs_survive_a_scheduler_crash_and_a_redis_flush(
    settings: Settings, cleanup: None, tmp_path: Path
) -> None:
    port = free_port()
    settings = msgspec.structs.replace(
        settings, fleet_nodes=16, gpus_per_node=8, http_port=port, telemetry_interval_s=1.0
    )
    names = Names(settings.namespace)
    procs = ServiceProcesses(settings, tmp_path)
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
            procs.kill("scheduler")
            await asyncio.sleep(1.0)
            procs.start("scheduler")

            await eventually(lambda: _at_least(succeeded, N_JOBS // 2), within=60, what="half done")
            client = aioredis.Redis.from_url(settings.redis_url)
            keys = [k async for k in client.scan_iter(match=f"{names.redis_prefix()}:*")]
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

    bus = await Bus.connect(settings.nats_url, names, "test")
    try:
        events = await read_stream(bus, names.stream(JOBS), Decoder(JobEvent))
        decisions = await read_stream(bus, names.stream(DECISIONS), Decoder(Decision))
    finally:
        await bus.close()

    finished = Counter(e.job_id for e in events if isinstance(e, JobFinished))
    assert set(finished) == set(ids)
    assert max(finished.values()) == 1, "every job finished exactly once"
    became_succeeded = Counter(
        d.record.id for d in decisions if isinstance(d, JobStateChanged) and d.record.state == "succeeded"
    )
    assert became_succeeded == Counter(ids), "every job succeeded exactly once"

    # No GPU held by two jobs at once: each attempt holds its GPUs from placement until it finished.
    placed = {(d.job_id, d.attempt): d for d in decisions if isinstance(d, JobPlaced)}
    ended = {(e.job_id, e.attempt): e.finished_at for e in events if isinstance(e, JobFinished)}
    holds: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for key, decision in placed.items():
        assert key in ended, f"attempt {key} was placed but never ended"
        for gpu in decision.gpus:
            holds[gpu.slot].append((decision.decided_at, ended[key], key[0]))
    for slot, intervals in holds.items():
        intervals.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(intervals):
            assert start >= end, f"{slot} held by {a} until {end} and by {b} from {start}"
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
