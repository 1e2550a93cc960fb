"""`chamber bench telemetry`: 100,000 distinct GPUs through real NATS into the fleet-metrics aggregator.

The aggregator runs as in production: its tick publishing a snapshot every `metrics_interval_s`, an inventory
of `gpus / 8` nodes, 90% of the GPUs held by running jobs (job records in the KV, claims in the ledger) and 1%
cordoned. A separate load-generator process (`chamber.collector.loadgen`) plays the node agents, one distinct
node name per 8 GPUs. The aggregator runs on uvloop with the service's garbage-collector settings, as the collector
service does, and with `cpu` set it is pinned to that one CPU and the load generator to the others, so
`samples_per_s` is what one core ingests (NATS is not pinned: it may take some of that core too).

- `samples_per_s`: GPU samples ingested per second (wall clock) while every node sends `rounds` batches as fast as
  the server takes them; `samples_per_cpu_s`: the same per second of the aggregator process's CPU time (what one
  dedicated core would do, whatever else the machine runs);
- `snapshot_ms_p50` / `_p99`: building one fleet snapshot over all GPUs, during both phases (`snapshot_cpu_ms_p99`:
  its CPU time);
- `sample_to_metric_p50_ms` / `_p99_ms`: every node reporting once per `--interval`, from each sample's own time
  to the publication of the first fleet snapshot that includes it (per GPU sample).
"""

import asyncio
import contextlib
import gc
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import msgspec

from chamber.collector.aggregator import Aggregator
from chamber.collector.loadgen import GPUS_PER_NODE, node_name
from chamber.common.bus import Bus
from chamber.common.cleanup import delete_namespace
from chamber.common.contracts import (
    Cordon,
    GpuDevice,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    Node,
    NodeInventory,
    Placement,
    Pool,
)
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Claim
from chamber.common.runtime import GC_THRESHOLDS, Context, loop_factory, make_context
from chamber.common.settings import Settings

ALLOCATED_SHARE = 0.9
CORDONED_SHARE = 0.01
TEAMS = 50
FLOOD_POLL_S = 0.02


def _loadgen(cpus: set[int] | None, *args: object) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "chamber.collector.loadgen", *map(str, args)])
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return proc


@contextlib.contextmanager
def _pinned(cpu: int | None) -> Iterator[set[int] | None]:
    """This process (the aggregator) on `cpu` alone until the end; yields the CPUs for the load generator (every
    other allowed one), or None with `cpu` None (no pinning)."""
    allowed = os.sched_getaffinity(0)
    if cpu is None:
        yield None
        return
    if cpu not in allowed or len(allowed) < 2:
        raise ValueError(f"cpu {cpu}: pinning needs that CPU and another one; this process may use {sorted(allowed)}")
    os.sched_setaffinity(0, {cpu})
    try:
        yield allowed - {cpu}
    finally:
        os.sched_setaffinity(0, allowed)


async def _populate(ctx: Context, bus: Bus, nodes: int) -> int:
    """Inventory for every node, running jobs on 90% of them (records and ledger claims), 1% of GPUs cordoned."""
    pool = Pool(name="h100", gpu_model="H100", cost_per_gpu_hour=2.5)
    for n in range(nodes):
        name = node_name(n)
        gpus = [GpuDevice(index=i, uuid=f"GPU-{name}-{i:02d}", model="H100") for i in range(GPUS_PER_NODE)]
        node = Node(name=name, pool="h100", gpus=gpus)
        await bus.publish_nowait(ctx.names.inventory(name), NodeInventory(node=node, pool=pool, observed_at=0.0))
    await bus.nc.flush(timeout=60)
    store = await JobStore.open(bus)
    now = time.time()
    records = []
    for n in range(int(nodes * ALLOCATED_SHARE)):
        spec = JobSpec(name=f"job-{n}", team=f"team-{n % TEAMS}", gpus_per_replica=GPUS_PER_NODE)
        placement = Placement(attempt=1, gpus=[GpuRef(node_name(n), i) for i in range(GPUS_PER_NODE)])
        records.append(JobRecord(id=f"job-{n}", spec=spec, state=JobState.RUNNING, submitted_at=now, updated_at=now,
                                 attempt=1, placement=placement, started_at=now))  # fmt: skip
    for i in range(0, len(records), 500):
        await asyncio.gather(*(store.create(r) for r in records[i : i + 500]))
    ledger = ctx.ledger()
    try:
        await ledger.rebuild(
            Claim(r.id, 1, tuple(f"{g.node}/{g.index}" for g in r.placement.gpus)) for r in records if r.placement
        )
        cordoned = [f"{node_name(n)}/0" for n in range(0, nodes, int(1 / CORDONED_SHARE / GPUS_PER_NODE) or 1)]
        await ledger.cordon(cordoned, Cordon(severity="degraded", reason="bench"))
    finally:
        await ledger.close()
    return len(records)


async def _ready(agg: Aggregator, nodes: int, jobs: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(agg.inventory) < nodes or len(agg.metrics.job_slots) < jobs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"aggregator saw {len(agg.inventory)} nodes and {len(agg.metrics.job_slots)} jobs")
        await asyncio.sleep(0.1)


async def _flood(
    agg: Aggregator, settings: Settings, prefix: str, nodes: int, rounds: int, *, cpus: set[int] | None
) -> dict[str, float]:
    expected = agg.metrics.samples + nodes * rounds * GPUS_PER_NODE
    proc = _loadgen(cpus, "flood", settings.nats_url, prefix, nodes, rounds)
    first: tuple[float, float, int] | None = None
    last = (time.perf_counter(), time.process_time(), agg.metrics.samples)
    idle_since = time.monotonic()
    while agg.metrics.samples < expected:
        await asyncio.sleep(FLOOD_POLL_S)
        samples = agg.metrics.samples
        if samples != last[2]:
            if first is None:
                first = last
            last = (time.perf_counter(), time.process_time(), samples)
            idle_since = time.monotonic()
        elif proc.poll() is not None and time.monotonic() - idle_since > 3:
            break  # the publisher is done and nothing more arrives
    await asyncio.to_thread(proc.wait, 60)
    if first is None:
        return {"samples_per_s": 0.0}
    got = last[2] - first[2]
    return {
        "samples_per_s": round(got / max(1e-9, last[0] - first[0])),
        "samples_per_cpu_s": round(got / max(1e-9, last[1] - first[1])),
        "flood_samples": got,
        "flood_samples_lost": expected - agg.metrics.samples,
    }


async def _steady(
    agg: Aggregator,
    settings: Settings,
    prefix: str,
    nodes: int,
    *,
    interval_s: float,
    seconds: float,
    cpus: set[int] | None,
) -> dict[str, float]:
    agg.metrics.take_reported()
    agg.lag.reset()
    proc = _loadgen(cpus, "steady", settings.nats_url, prefix, nodes, interval_s, seconds)
    await asyncio.to_thread(proc.wait, seconds + 120)
    await asyncio.sleep(2 * settings.metrics_interval_s)
    return {
        "interval_s": interval_s,
        "lag_samples": agg.lag.total,
        "sample_to_metric_p50_ms": agg.lag.quantile(0.5),
        "sample_to_metric_p99_ms": agg.lag.quantile(0.99),
    }


async def _bench(
    settings: Settings, gpus: int, rounds: int, interval_s: float, seconds: float, *, loadgen_cpus: set[int] | None
) -> dict[str, float]:
    ctx = make_context(settings, "bench")
    bus = await Bus.connect(settings.nats_url, ctx.names, "bench")
    await bus.ensure_streams()
    nodes = gpus // GPUS_PER_NODE
    prefix = ctx.names.subject("telemetry")
    agg = Aggregator(ctx, bus, ctx.ledger(), await JobStore.open(bus))
    try:
        jobs = await _populate(ctx, bus, nodes)
        await agg.start(serve_metrics=False)
        await _ready(agg, nodes, jobs)
        stop = asyncio.Event()
        runner = asyncio.create_task(agg.run(stop))
        result: dict[str, float] = {"gpus": nodes * GPUS_PER_NODE, "nodes": nodes, "jobs": jobs,
                                    "aggregator_cpus": len(os.sched_getaffinity(0))}  # fmt: skip
        result.update(await _flood(agg, settings, prefix, nodes, rounds, cpus=loadgen_cpus))
        result.update(await _steady(agg, settings, prefix, nodes, interval_s=interval_s, seconds=seconds,
                                    cpus=loadgen_cpus))  # fmt: skip
        stop.set()
        await runner
        snaps, cpu = sorted(agg.snapshot_ms), sorted(agg.snapshot_cpu_ms)
        last = agg.latest
        result.update({
            "snapshots": len(snaps),
            "snapshot_ms_p50": round(statistics.median(snaps), 2),
            "snapshot_ms_p99": round(snaps[int(0.99 * (len(snaps) - 1))], 2),
            "snapshot_cpu_ms_p99": round(cpu[int(0.99 * (len(cpu) - 1))], 2),
            "snapshot_gpus_total": last.gpus_total if last else 0,
            "snapshot_gpus_allocated": last.gpus_allocated if last else 0,
            "snapshot_gpus_healthy": last.gpus_healthy if last else 0,
            "snapshot_bytes": len(msgspec.json.encode(last)) if last else 0,
        })  # fmt: skip
        return result
    finally:
        await agg.close()
        await agg.ledger.close()
        await bus.close()


def run(
    *, gpus: int = 100_000, rounds: int = 20, interval_s: float = 1.0, seconds: float = 15.0, cpu: int | None = None
) -> dict[str, float]:
    from chamber.cli.infra import resolve

    infra = resolve()
    try:
        settings = Settings.from_env(
            nats_url=infra.nats_url, redis_url=infra.redis_url, namespace=f"bench{uuid.uuid4().hex[:8]}",
            metrics_port=0,
        )  # fmt: skip

        async def go() -> dict[str, float]:
            try:
                with _pinned(cpu) as loadgen_cpus:
                    return await _bench(settings, gpus, rounds, interval_s, seconds, loadgen_cpus=loadgen_cpus)
            finally:
                await delete_namespace(settings.nats_url, settings.redis_url, settings.namespace)

        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)  # the aggregator as the collector service runs it: its GC settings, uvloop
        try:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                return runner.run(go())
        finally:
            gc.set_threshold(*thresholds)
    finally:
        infra.stop()
