"""`chamber bench telemetry`: node batches through real NATS into the fleet-metrics aggregator.

- `samples_per_s`: GPU samples ingested per second by one aggregator process, fed as fast as a separate publisher
  process can send pre-encoded node batches (8 GPUs each) for `--gpus` GPUs, several rounds;
- `metrics_lag_p99_ms`: with 10,000 GPUs reporting every second, from a batch's publish to the first fleet
  snapshot that includes it.
"""

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec

from chamber.collector.aggregator import Aggregator
from chamber.common.bus import Bus
from chamber.common.cleanup import delete_namespace
from chamber.common.codec import encode
from chamber.common.contracts import GpuSample, NodeTelemetry
from chamber.common.jobstore import JobStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings

GPUS_PER_NODE = 8

PUBLISHER = """
import asyncio, sys, nats
async def main():
    url, prefix, nodes, rounds, payload = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    data = open(payload, "rb").read()
    nc = await nats.connect(url, pending_size=256 * 1024 * 1024)
    for _ in range(rounds):
        for n in range(nodes):
            await nc.publish(f"{prefix}.node-{n:06d}", data)
    await nc.flush(timeout=60)
    await nc.close()
asyncio.run(main())
"""


def _batch(node: str, at: float) -> NodeTelemetry:
    gpus = [
        GpuSample(index=i, uuid=f"GPU-{node}-{i}", gpu_util=80.0, mem_util=40.0, mem_used_mb=60_000.0,
                  mem_total_mb=81_559.0, temperature_c=60.0, power_w=500.0, power_limit_w=700.0,
                  ecc_dbe_volatile=0, ecc_sbe_volatile=0, clock_event_reasons=0)
        for i in range(GPUS_PER_NODE)
    ]  # fmt: skip
    return NodeTelemetry(node=node, sampled_at=at, interval_s=1.0, gpus=gpus)


def _start_publisher(url: str, prefix: str, nodes: int, rounds: int) -> tuple[Path, subprocess.Popen[bytes]]:
    """A separate process sends pre-encoded batches, so the publisher's CPU does not count against the consumer."""
    payload = Path(tempfile.gettempdir(), f"chamber-bench-{uuid.uuid4().hex}.json")
    payload.write_bytes(encode(_batch("node-x", time.time())))
    cmd = [sys.executable, "-c", PUBLISHER, url, prefix, str(nodes), str(rounds), str(payload)]
    return payload, subprocess.Popen(cmd)


async def _throughput(settings: Settings, gpus: int, rounds: int) -> dict[str, float]:
    ctx = make_context(settings, "bench")
    bus = await Bus.connect(settings.nats_url, ctx.names, "bench")
    await bus.ensure_streams()
    agg = Aggregator(ctx, bus, ctx.ledger(), await JobStore.open(bus))
    await agg.start(serve_metrics=False)
    nodes = gpus // GPUS_PER_NODE
    expected = nodes * rounds * GPUS_PER_NODE
    payload, proc = _start_publisher(settings.nats_url, ctx.names.subject("telemetry"), nodes, rounds)
    first = None
    deadline = time.monotonic() + 300
    while agg.metrics.samples < expected and time.monotonic() < deadline:
        if first is None and agg.metrics.samples:
            first = (time.perf_counter(), agg.metrics.samples)
        await asyncio.sleep(0.005)
    end = time.perf_counter()
    await asyncio.to_thread(proc.wait, 60)
    payload.unlink()
    got = agg.metrics.samples
    await agg.close()
    await bus.close()
    if first is None:
        return {"samples_per_s": 0.0, "samples_ingested": float(got)}
    return {
        "samples_per_s": round((got - first[1]) / max(1e-9, end - first[0])),
        "samples_ingested": got,
        "samples_expected": expected,
    }


async def _lag(settings: Settings, gpus: int, seconds: float) -> dict[str, float]:
    settings = msgspec.structs.replace(settings, metrics_interval_s=0.25)
    ctx = make_context(settings, "bench")
    bus = await Bus.connect(settings.nats_url, ctx.names, "bench")
    await bus.ensure_streams()
    agg = Aggregator(ctx, bus, ctx.ledger(), await JobStore.open(bus))
    await agg.start(serve_metrics=False)
    stop = asyncio.Event()
    runner = asyncio.create_task(agg.run(stop))
    nodes = gpus // GPUS_PER_NODE
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        second = time.monotonic()
        for n in range(nodes):
            # Spread each node's report over the second, as independent agents would.
            target = second + n / nodes
            delay = target - time.monotonic()
            if delay > 0.002:
                await asyncio.sleep(delay)
            await bus.publish_nowait(ctx.names.telemetry(f"node-{n:05d}"), _batch(f"node-{n:05d}", time.time()))
            sent += 1
        await asyncio.sleep(max(0.0, second + 1 - time.monotonic()))
    await asyncio.sleep(1.0)
    stop.set()
    await runner
    lags = sorted(agg.lags_ms)
    await agg.close()
    await bus.close()
    return {
        "lag_gpus": gpus,
        "lag_batches": len(lags),
        "metrics_lag_p50_ms": round(statistics.median(lags), 1) if lags else -1,
        "metrics_lag_p99_ms": round(lags[min(len(lags) - 1, int(0.99 * len(lags)))], 1) if lags else -1,
    }


async def _cleanup(settings: Settings) -> None:
    await delete_namespace(settings.nats_url, settings.redis_url, settings.namespace)


def run(gpus: int = 100_000, rounds: int = 5, lag_gpus: int = 10_000, lag_seconds: float = 10.0) -> dict[str, float]:
    from chamber.cli.infra import resolve

    infra = resolve()
    try:
        settings = Settings.from_env(
            nats_url=infra.nats_url, redis_url=infra.redis_url, namespace=f"bench{uuid.uuid4().hex[:8]}",
            metrics_port=0,
        )  # fmt: skip

        async def both() -> dict[str, float]:
            try:
                result = {"gpus": gpus, **await _throughput(settings, gpus, rounds)}
                result.update(await _lag(settings, lag_gpus, lag_seconds))
                return result
            finally:
                await _cleanup(settings)

        return asyncio.run(both())
    finally:
        infra.stop()
