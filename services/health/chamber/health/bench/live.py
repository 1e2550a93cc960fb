"""The live part of `chamber bench health`: the real health and scheduler services (their own processes, with the
simulated executor) on real NATS and Redis, jobs on 90% of the nodes, noisy telemetry from every node every
interval, and faults of every rule family injected into nodes that run jobs.

Times are wall-clock (`time.time()` on this machine, which stamps the samples too): a verdict counts when the
bench receives it (the cordon is written before the verdict is published), a job stop when the executor's
`JobStopped` arrives.
"""

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    GpuDevice,
    GpuHealthVerdict,
    GpuXidEvent,
    HealthState,
    JobEvent,
    JobSpec,
    JobStopped,
    JobSubmitted,
    Node,
    NodeInventory,
    Pool,
    to_columns,
)
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.health.bench.fleet import FAMILIES, GPUS_PER_NODE, Fault, Noise, NoisyFleet, reference
from chamber.health.core.engine import HealthConfig

JOB_SHARE = 0.9
STALL_S = 20.0
QUARANTINED = HealthState.QUARANTINED


@dataclass
class Observed:
    verdicts: list[tuple[float, GpuHealthVerdict]] = field(default_factory=list)
    rounds_s: list[float] = field(default_factory=list)
    """How long each round of telemetry (every node once) took to send: a starved bench shows here."""
    stopped: dict[str, float] = field(default_factory=dict)
    """job -> when its first stop was reported."""


def _service(name: str, settings: Settings) -> subprocess.Popen[bytes]:
    """The service in its own process; its log goes to `CHAMBER_BENCH_LOG_DIR/<name>.log` when that is set."""
    env = {**os.environ, **settings.to_env(), "PYTHONUNBUFFERED": "1"}
    log_dir = os.environ.get("CHAMBER_BENCH_LOG_DIR")
    out = open(os.path.join(log_dir, f"{name}.log"), "wb") if log_dir else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "chamber.cli.main", "service", name], env=env, stdout=out,
                            stderr=out)  # fmt: skip


async def _inventory(bus: Bus, fleet: NoisyFleet) -> None:
    pool = Pool(name="default", gpu_model="H100", cost_per_gpu_hour=2.5)
    for node in fleet.nodes:
        gpus = [GpuDevice(index=i, uuid=f"GPU-{node.name}-{i}", model="H100") for i in range(GPUS_PER_NODE)]
        inv = NodeInventory(node=Node(name=node.name, pool="default", gpus=gpus), pool=pool, observed_at=time.time())
        await bus.publish_nowait(bus.names.inventory(node.name), inv)
    await bus.nc.flush(timeout=30)


async def _telemetry(bus: Bus, fleet: NoisyFleet, stop: asyncio.Event, seen: Observed) -> None:
    """Every node once per interval, spread over it; a few samples arrive late."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()

    def later(subject: str, batch: Any) -> None:
        task = asyncio.ensure_future(bus.publish_nowait(subject, batch))
        pending.add(task)
        task.add_done_callback(pending.discard)

    n = len(fleet.nodes)
    while not stop.is_set():
        start = time.time()
        for i, node in enumerate(fleet.nodes):
            delay = start + i * fleet.interval_s / n - time.time()
            if delay > 0.002:
                await asyncio.sleep(delay)
            sampled = fleet.sample_node(node, time.time())
            if sampled is None:
                continue
            batch = to_columns(sampled)  # as node agents publish it
            late = fleet.late_by()
            if late:
                loop.call_later(late, later, bus.names.telemetry(node.name), batch)
            else:
                await bus.publish_nowait(bus.names.telemetry(node.name), batch)
        seen.rounds_s.append(time.time() - start)
        await asyncio.sleep(max(0.0, start + fleet.interval_s - time.time()))


async def _watch(bus: Bus, seen: Observed) -> list[Any]:
    verdicts, jobs = Decoder(GpuHealthVerdict), Decoder(JobEvent)

    async def on_verdict(msg: Any) -> None:
        seen.verdicts.append((time.time(), verdicts.decode(msg.data)))

    async def on_job(msg: Any) -> None:
        event = jobs.decode(msg.data)
        if isinstance(event, JobStopped):
            seen.stopped.setdefault(event.job_id, time.time())

    return [
        await bus.nc.subscribe(bus.names.subject("health.verdicts.>"), cb=on_verdict),
        await bus.nc.subscribe(bus.names.subject("jobs.lifecycle.>"), cb=on_job),
    ]


async def _start_jobs(bus: Bus, ledger: Any, nodes: int, timeout_s: float = 600) -> None:
    jobs = int(nodes * JOB_SHARE)
    now = time.time()
    for j in range(jobs):
        spec = JobSpec(name=f"train-{j}", team="bench", gpus_per_replica=GPUS_PER_NODE, duration_s=7200.0)
        job_id = f"job-{j:05d}"
        await bus.publish(bus.names.job_submit(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=now),
                          msg_id=job_id)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    placed, progress_at = 0, time.monotonic()
    while placed < jobs * GPUS_PER_NODE:
        await asyncio.sleep(0.5)
        now_placed = len((await ledger.snapshot()).owners)
        if now_placed > placed:
            placed, progress_at = now_placed, time.monotonic()
        elif placed and time.monotonic() - progress_at > STALL_S:
            return  # what could be placed is placed (a node the noise got quarantined holds no job)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler placed {placed // GPUS_PER_NODE} of the bench's {jobs} jobs")


def _pick(owners: dict[str, str], fleet: NoisyFleet, per_family: int, rng: random.Random) -> list[tuple[str, int]]:
    """(family, node index) for every fault, each on its own node that runs a job."""
    busy = sorted({int(slot.split("/")[0].split("-")[1]) for slot in owners})
    chosen = rng.sample(busy, per_family * len(FAMILIES))
    return [(family, chosen[i * len(FAMILIES) + f]) for i in range(per_family) for f, family in enumerate(FAMILIES)]


async def run_live(
    settings: Settings, *, nodes: int, noise: Noise, quiet_s: float, per_family: int, wait_s: float = 240.0
) -> tuple[list[Fault], Observed, dict[str, str], float]:
    """Faults, what was seen, the ledger's owners at injection (slot -> job/attempt), when injection began."""
    ctx = make_context(settings, "bench")
    bus = await Bus.connect(settings.nats_url, ctx.names, "bench")
    await bus.ensure_streams()
    ledger = ctx.ledger()
    await ledger.rebuild([])
    fleet = NoisyFleet(nodes, noise, settings.telemetry_interval_s)
    procs: list[subprocess.Popen[bytes]] = []
    stop = asyncio.Event()
    seen = Observed()
    subs = await _watch(bus, seen)
    feeder: asyncio.Task[None] | None = None
    try:
        await _inventory(bus, fleet)
        procs = [_service("health", settings), _service("scheduler", settings)]
        feeder = asyncio.create_task(_telemetry(bus, fleet, stop, seen))
        await _start_jobs(bus, ledger, nodes)
        await asyncio.sleep(quiet_s)
        owners = (await ledger.snapshot()).owners
        rng = random.Random(3)
        faults: list[Fault] = []
        injected_at = time.time()
        for k, (family, node) in enumerate(_pick(owners, fleet, per_family, rng)):
            onset = injected_at + 0.1 * k
            fault = fleet.inject(family, node, rng.randrange(GPUS_PER_NODE), onset)
            faults.append(fault)
            if family == "xid":
                await asyncio.sleep(max(0.0, onset - time.time()))
                event = GpuXidEvent(node=fault.node, gpu_index=fault.gpu, uuid=f"GPU-{fault.node}-{fault.gpu}",
                                    xid=119, observed_at=time.time())  # fmt: skip
                fault.onset = event.observed_at
                await bus.publish_nowait(bus.names.telemetry(fault.node), event)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not _all_seen(faults, seen, owners):  # noqa: ASYNC110 - polls two feeds
            await asyncio.sleep(0.5)
        return faults, seen, owners, injected_at
    finally:
        stop.set()
        if feeder is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
        for sub in subs:
            await sub.unsubscribe()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                proc.kill()
        await bus.close()
        await ledger.close()


def job_of(fault: Fault, owners: dict[str, str]) -> str | None:
    holder = owners.get(f"{fault.node}/{fault.gpu}") or owners.get(f"{fault.node}/0")
    return holder.rsplit("/", 1)[0] if holder else None


def quarantined_at(fault: Fault, seen: Observed) -> float | None:
    gpu = None if fault.node_scoped else fault.gpu
    hits = (t for t, v in seen.verdicts if v.node == fault.node and v.gpu_index == gpu and v.state == QUARANTINED)
    return next(hits, None)


def _all_seen(faults: list[Fault], seen: Observed, owners: dict[str, str]) -> bool:
    for fault in faults:
        job = job_of(fault, owners)
        if quarantined_at(fault, seen) is None or (job is not None and job not in seen.stopped):
            return False
    return True


def reference_of(fault: Fault, config: HealthConfig, interval_s: float) -> float | None:
    limit = max(config.heartbeat_intervals * interval_s, config.heartbeat_min_s)
    return reference(fault, limit)
