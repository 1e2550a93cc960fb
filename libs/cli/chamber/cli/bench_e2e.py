"""`chamber bench e2e`: what a user meets, timed: HTTP submit -> JetStream -> scheduler -> ledger claim -> record
-> `decisions.placed`, with the real services running as processes (as `chamber up` runs them).

The fleet is `--nodes` x `--gpus-per-node` in pool `default`, plus a small pool `busy` whose GPUs are held by
long-running inference jobs. `--pending` jobs are pre-loaded into `busy` (straight onto the bus, fast) and wait
there for capacity, so every scheduling cycle has them in its queue: the hard case of a deep queue. Then `--jobs`
one-GPU jobs are submitted over HTTP by `--clients` concurrent clients, as fast as the gateway takes them, with
short durations (so the default pool never fills: what is timed is the scheduler, not a lack of GPUs). Each
job's `decisions.placed` is timestamped on arrival.
"""

import asyncio
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from chamber.cli.infra import free_port, resolve
from chamber.common.bus import Bus
from chamber.common.cleanup import delete_namespace
from chamber.common.codec import encode
from chamber.common.contracts import JobSpec, JobSubmitted, SchedulerStats
from chamber.common.settings import Settings
from chamber.common.subjects import Names

SERVICES = ("collector", "scheduler", "health", "quota", "gateway")
TOKEN = f"bench-{secrets.token_hex(16)}"
"""The benchmark's own Chamber gets this first admin token; submits are authenticated, as a user's are."""
BUSY_NODES = 4
SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4)]
CLASSES = ["research", "best-effort"]


@dataclass
class E2EConfig:
    nodes: int = 128
    gpus_per_node: int = 8
    jobs: int = 5000
    pending: int = 0
    clients: int = 32
    teams: int = 20
    duration_s: tuple[float, float] = (0.2, 0.4)
    seed: int = 1
    timeout_s: float = 300.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Services:
    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.env = {**os.environ, **settings.to_env(), "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        for name in SERVICES:
            log = (self.log_dir / f"{name}.log").open("wb")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "chamber.cli.main", "service", name], env=self.env, stdout=log, stderr=log
            )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is not None]


async def run(cfg: E2EConfig) -> dict[str, Any]:
    infra = resolve()
    namespace = f"bench{secrets.token_hex(4)}"
    settings = Settings.from_env(
        nats_url=infra.nats_url, redis_url=infra.redis_url, namespace=namespace, http_port=free_port(),
        metrics_port=free_port(), fleet_nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node,
        fleet_pools=f"default:H100:{cfg.nodes},busy:H100:{BUSY_NODES}", telemetry_interval_s=5.0, log_format="json",
        log_level="WARNING", admin_token=TOKEN, grpc_port=free_port(),
    )  # fmt: skip
    log_dir = Path(tempfile.mkdtemp(prefix="chamber-bench-e2e-"))
    services = _Services(settings, log_dir)
    services.start()
    try:
        return await _bench(cfg, settings, services)
    finally:
        services.stop()
        await delete_namespace(settings.nats_url, settings.redis_url, namespace)
        infra.stop()


async def _bench(cfg: E2EConfig, settings: Settings, services: _Services) -> dict[str, Any]:
    api = f"http://127.0.0.1:{settings.http_port}"
    names = Names(settings.namespace)
    total_gpus = (cfg.nodes + BUSY_NODES) * cfg.gpus_per_node
    bus = await Bus.connect(settings.nats_url, names, "bench")
    placed_at: dict[str, float] = {}
    stats: list[SchedulerStats] = []
    stats_decoder = msgspec.json.Decoder(SchedulerStats)
    prefix = len(names.subject("decisions.placed."))

    async def on_placed(msg: Any) -> None:
        placed_at.setdefault(msg.subject[prefix:], time.perf_counter())

    async def on_stats(msg: Any) -> None:
        stats.append(stats_decoder.decode(msg.data))

    await bus.nc.subscribe(names.subject("decisions.placed.>"), cb=on_placed)
    await bus.nc.subscribe(names.scheduler_stats(), cb=on_stats)
    rng = random.Random(cfg.seed)
    connector = aiohttp.TCPConnector(limit=cfg.clients)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(api, connector=connector, headers=auth) as http:
        await _until(lambda: _fleet_ready(http, total_gpus), 60, "the services are up with every GPU", services)
        blockers = [
            {"name": f"blocker-{i}", "team": "serving", "gpus_per_replica": cfg.gpus_per_node, "priority": "inference",
             "pool": "busy", "duration_s": 86400}
            for i in range(BUSY_NODES)
        ]  # fmt: skip
        for body in blockers:
            async with http.post("/v1/jobs", json=body) as resp:
                resp.raise_for_status()
        await _until(lambda: _placed_count(placed_at, BUSY_NODES), 60, "the busy pool is full", services)
        if cfg.pending:
            await _preload(bus, names, cfg, rng)
            await _until(lambda: _waiting(stats, cfg.pending), 600, f"{cfg.pending} jobs waiting", services)
        stats.clear()
        submitted_at: dict[str, float] = {}
        latencies: list[float] = []
        bodies = [
            {"name": f"e2e-{i}", "team": f"team-{i % cfg.teams}", "gpus_per_replica": 1, "priority": "train",
             "duration_s": round(rng.uniform(*cfg.duration_s), 3)}
            for i in range(cfg.jobs)
        ]  # fmt: skip
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)

        async def client() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                t0 = time.perf_counter()
                async with http.post("/v1/jobs", json=body) as resp:
                    data = await resp.json()
                    if resp.status != 201:
                        raise RuntimeError(f"submit refused: {resp.status} {data}")
                submitted_at[data["id"]] = t0
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(cfg.clients)))
        submit_s = time.perf_counter() - started
        await _until(
            lambda: _all_placed(placed_at, submitted_at), cfg.timeout_s, "every submitted job placed", services
        )
        await asyncio.sleep(1.2)  # one more scheduler report
    await bus.close()
    waits = [(placed_at[j] - t) * 1000 for j, t in submitted_at.items()]
    last = max(placed_at[j] for j in submitted_at)
    return {
        "nodes": cfg.nodes,
        "gpus": total_gpus,
        "pending": cfg.pending,
        "jobs": cfg.jobs,
        "clients": cfg.clients,
        "submit_per_s": round(cfg.jobs / submit_s),
        "submit_p99_ms": round(_pct(latencies, 0.99) * 1000, 1),
        "placed_per_s": round(cfg.jobs / (last - started)),
        "submit_to_placed_p50_ms": round(_pct(waits, 0.5), 1),
        "submit_to_placed_p99_ms": round(_pct(waits, 0.99), 1),
        "submit_to_placed_max_ms": round(max(waits), 1),
        "scheduler_cycle_p99_ms": round(max((s.decide_p99_ms for s in stats), default=0.0), 2),
        "scheduler_apply_p99_ms": round(max((s.apply_p99_ms for s in stats), default=0.0), 2),
        "scheduler_waiting_at_end": stats[-1].waiting if stats else None,
        "scheduler_rss_mb": max((s.rss_mb for s in stats), default=0.0),
    }


async def _preload(bus: Bus, names: Names, cfg: E2EConfig, rng: random.Random) -> None:
    """The waiting backlog, straight onto the JOBS stream (as the gateway would publish it, only faster)."""
    now = time.time()
    chunk: list[tuple[str, bytes, dict[str, str] | None]] = []
    for i in range(cfg.pending):
        per, replicas = rng.choice(SHAPES)
        job_id = f"jp{i:07d}{secrets.token_hex(2)}"
        spec = JobSpec(
            name=f"backlog-{i}", team=f"team-{rng.randrange(cfg.teams)}", gpus_per_replica=per, replicas=replicas,
            priority=rng.choice(CLASSES), pool="busy", duration_s=60.0,
        )  # fmt: skip
        event = JobSubmitted(job_id=job_id, spec=spec, submitted_at=now + i * 1e-6)
        chunk.append((names.job_submit(job_id), encode(event), {"Nats-Msg-Id": job_id}))
        if len(chunk) == 2000 or i == cfg.pending - 1:
            for result in await bus.publish_many(chunk):
                if isinstance(result, Exception):
                    raise result
            chunk = []


async def _fleet_ready(http: aiohttp.ClientSession, gpus: int) -> bool:
    try:
        async with http.get("/v1/fleet") as resp:
            return resp.status == 200 and (await resp.json()).get("gpus_total") == gpus
    except aiohttp.ClientError:
        return False


async def _placed_count(placed: dict[str, float], n: int) -> bool:
    return len(placed) >= n


async def _waiting(stats: list[SchedulerStats], n: int) -> bool:
    return bool(stats) and stats[-1].waiting >= n


async def _all_placed(placed: dict[str, float], submitted: dict[str, float]) -> bool:
    return all(job in placed for job in submitted)


async def _until(check: Any, within: float, what: str, services: _Services) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await check():
            return
        dead = services.dead()
        if dead:
            raise RuntimeError(f"service(s) {', '.join(dead)} died; logs in {services.log_dir}")
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what}: not within {within:g} s; logs in {services.log_dir}")
