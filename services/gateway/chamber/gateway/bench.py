"""`chamber bench gateway`: the real system as processes (collector, scheduler, quota, health, gateway, as
`chamber up` runs them), loaded through HTTP with tokens:

- reads: `connections` keep-alive connections alternate `GET /v1/jobs?limit=50` and `GET /v1/fleet` as fast as the
  gateway answers, for `seconds`, with `preload` jobs in the store: `reads_per_s`, read latency;
- submits: `POST /v1/jobs` with a member token, open loop at `submit_rate` per second for `seconds` (latency is
  measured from when each request was due, so a stalled gateway cannot hide its queue): `submit_p99_ms`.

The load generator is a minimal HTTP/1.1 client on asyncio streams (uvloop when installed) in this process, so it
competes with the services for the same cores, as a client on the same machine would.
"""

import asyncio
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chamber.cli.infra import free_port, resolve
from chamber.common.cleanup import delete_namespace
from chamber.common.loadgen import Conn, cpu_s, request
from chamber.common.runtime import loop_factory

SERVICES = ("collector", "scheduler", "quota", "health", "gateway")
READ_PATHS = ("/v1/jobs?limit=50", "/v1/fleet")


@dataclass
class BenchConfig:
    seconds: float = 10.0
    connections: int = 32
    submit_rate: float = 500.0
    preload: int = 1000
    nodes: int = 128
    submit_connections: int = 64


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Phase:
    ok: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    by_status: dict[int, int] = field(default_factory=dict)


async def _reads(port: int, token: str, connections: int, seconds: float) -> tuple[Phase, dict[str, int], float]:
    phase = Phase()
    by_path = dict.fromkeys(READ_PATHS, 0)
    requests = [request("GET", p, token) for p in READ_PATHS]
    stop_at = time.perf_counter() + seconds

    async def worker(n: int) -> None:
        conn = await Conn.open(port)
        i = n
        try:
            while time.perf_counter() < stop_at:
                which = i % len(requests)
                started = time.perf_counter()
                status, _ = await conn.call(requests[which])
                phase.latencies_ms.append((time.perf_counter() - started) * 1000)
                phase.by_status[status] = phase.by_status.get(status, 0) + 1
                if status == 200:
                    phase.ok += 1
                    by_path[READ_PATHS[which]] += 1
                else:
                    phase.errors += 1
                i += 1
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(connections)))
    return phase, by_path, time.perf_counter() - started


async def _submits(
    port: int, token: str, *, rate: float, seconds: float, pool_size: int, tag: str, duration_s: float = 5.0
) -> tuple[Phase, float]:
    phase = Phase()
    idle: asyncio.Queue[Conn] = asyncio.Queue()
    for _ in range(pool_size):
        idle.put_nowait(await Conn.open(port))
    total = int(rate * seconds)
    start = time.perf_counter() + 0.05

    async def one(i: int) -> None:
        due = start + i / rate
        body = json.dumps({"name": f"{tag}-{i}", "team": "bench", "gpus_per_replica": 1, "duration_s": duration_s,
                           "priority": "research"}).encode()  # fmt: skip
        conn = await idle.get()
        try:
            status, _ = await conn.call(request("POST", "/v1/jobs", token, body))
        finally:
            idle.put_nowait(conn)
        phase.latencies_ms.append((time.perf_counter() - due) * 1000)
        phase.by_status[status] = phase.by_status.get(status, 0) + 1
        if status == 201:
            phase.ok += 1
        else:
            phase.errors += 1

    tasks = []
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    while not idle.empty():
        idle.get_nowait().close()
    return phase, total / elapsed if elapsed > 0 else 0.0


async def _http(port: int, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    conn = await Conn.open(port)
    try:
        status, raw = await conn.call(request(method, path, token, json.dumps(body).encode() if body else b""))
    finally:
        conn.close()
    return status, json.loads(raw) if raw else None


async def _wait(check: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError, asyncio.IncompleteReadError):
            if await check():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: {what} did not happen within {timeout_s:.0f} s")
        await asyncio.sleep(0.2)


async def _drive(cfg: BenchConfig, port: int, admin: str, gateway_pid: int) -> dict[str, Any]:
    async def fleet_ready() -> bool:
        status, fleet = await _http(port, "GET", "/v1/fleet", admin)
        return status == 200 and fleet["gpus_total"] == cfg.nodes * 8

    await _wait(fleet_ready, "the fleet's inventory")
    _, member = await _http(port, "POST", "/v1/tokens", admin, {"name": "bench-member", "role": "member",
                                                                 "teams": ["bench"]})  # fmt: skip
    _, viewer = await _http(port, "POST", "/v1/tokens", admin, {"name": "bench-viewer", "role": "viewer"})
    preload, _ = await _submits(port, member["token"], rate=1000.0, seconds=cfg.preload / 1000.0, pool_size=16,
                                tag="preload", duration_s=3600.0)  # fmt: skip

    async def settled() -> bool:
        status, jobs = await _http(port, "GET", f"/v1/jobs?limit={cfg.preload}", admin)
        return status == 200 and len(jobs) >= preload.ok

    await _wait(settled, "the preloaded jobs reaching the job store", timeout_s=300.0)
    cpu0 = cpu_s(gateway_pid)
    reads, by_path, read_s = await _reads(port, viewer["token"], cfg.connections, cfg.seconds)
    cpu1 = cpu_s(gateway_pid)
    cpu2 = cpu_s(gateway_pid)
    submits, achieved = await _submits(port, member["token"], rate=cfg.submit_rate, seconds=cfg.seconds,
                                       pool_size=cfg.submit_connections, tag="bench")  # fmt: skip
    cpu3 = cpu_s(gateway_pid)
    _, jobs = await _http(port, "GET", "/v1/fleet", admin)
    measured = None not in (cpu0, cpu1, cpu2, cpu3)
    lat = submits.latencies_ms
    return {
        "reads_per_s": round(reads.ok / read_s, 1),
        "read_p50_ms": round(statistics.median(reads.latencies_ms), 2) if reads.latencies_ms else 0.0,
        "read_p99_ms": round(_percentile(reads.latencies_ms, 0.99), 2),
        "reads_by_path": by_path,
        "read_errors": reads.errors,
        "read_connections": cfg.connections,
        "gateway_cpu_ms_per_read": round((cpu1 - cpu0) * 1000 / max(1, reads.ok), 3) if measured else None,  # type: ignore[operator]
        "gateway_cpu_share_during_reads": round((cpu1 - cpu0) / read_s, 2) if measured else None,  # type: ignore[operator]
        "submit_rate_target": cfg.submit_rate,
        "submit_rate_achieved": round(achieved, 1),
        "submits": submits.ok,
        "submit_errors": submits.errors,
        "submit_statuses": {str(k): v for k, v in sorted(submits.by_status.items())},
        "submit_p50_ms": round(statistics.median(lat), 2) if lat else 0.0,
        "submit_p99_ms": round(_percentile(lat, 0.99), 2),
        "submit_max_ms": round(max(lat), 2) if lat else 0.0,
        "gateway_cpu_ms_per_submit": round((cpu3 - cpu2) * 1000 / max(1, submits.ok), 3) if measured else None,  # type: ignore[operator]
        "preloaded_jobs": preload.ok,
        "queue_depth_after": jobs["queue_depth"],
        "fleet_gpus": cfg.nodes * 8,
        "cores": os.cpu_count(),
        "load_average_1m_after": round(os.getloadavg()[0], 1),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    infra = resolve()
    namespace = f"bench{secrets.token_hex(4)}"
    port = free_port()
    admin = secrets.token_urlsafe(24)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")},
           "CHAMBER_NATS_URL": infra.nats_url, "CHAMBER_REDIS_URL": infra.redis_url, "CHAMBER_NAMESPACE": namespace,
           "CHAMBER_HTTP_PORT": str(port), "CHAMBER_METRICS_PORT": "0", "CHAMBER_GRPC_PORT": "0",
           "CHAMBER_ADMIN_TOKEN": admin, "CHAMBER_FLEET_NODES": str(cfg.nodes)}  # fmt: skip
    logs = tempfile.mkdtemp(prefix="chamber-bench-")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in SERVICES:
            with open(Path(logs, f"{name}.log"), "wb") as out:
                procs[name] = subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "service", name], env=env,
                                               stdout=out, stderr=out)  # fmt: skip
        factory = loop_factory()
        with asyncio.Runner(loop_factory=factory) as runner:
            result = runner.run(_drive(cfg, port, admin, procs["gateway"].pid))
        result["client_loop"] = "uvloop" if factory is not None else "asyncio"
        result["config"] = asdict(cfg)
        return result
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        asyncio.run(delete_namespace(infra.nats_url, infra.redis_url, namespace))
        infra.stop()
        for path in Path(logs).glob("*.log"):
            path.unlink()
        os.rmdir(logs)
