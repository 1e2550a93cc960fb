"""`chamber bench health`: the real health service on real NATS and Redis, live telemetry, injected faults.

- `false_quarantines`: quarantines during a fault-free stretch (every GPU reporting every second);
- `detect_to_quarantine_p50_ms` / `_p99_ms`: from publishing a faulty sample to the verdict being published, the
  GPU already unschedulable in the ledger (the cordon is written before the verdict).
"""

import asyncio
import random
import statistics
import time
import uuid
from typing import Any

from chamber.common.bus import Bus
from chamber.common.cleanup import delete_namespace
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    GpuDevice,
    GpuHealthVerdict,
    GpuSample,
    HealthState,
    Node,
    NodeInventory,
    NodeTelemetry,
    Pool,
)
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from chamber.health.service import Health

GPUS_PER_NODE = 8


def _healthy(index: int) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", gpu_util=80.0, power_w=500.0, power_limit_w=700.0,
                     ecc_dbe_volatile=0, ecc_sbe_volatile=0, clock_event_reasons=0, remapped_rows_pending=False,
                     remapped_rows_failure=False, nvlink_replay_errors=0, pcie_replay_count=0)  # fmt: skip


async def _run(settings: Settings, gpus: int, quiet_s: float, faults: int) -> dict[str, float]:
    ctx = make_context(settings, "health")
    bus = await Bus.connect(settings.nats_url, ctx.names, "health")
    await bus.ensure_streams()
    ledger = ctx.ledger()
    nodes = [f"node-{i:05d}" for i in range(gpus // GPUS_PER_NODE)]
    pool = Pool(name="default", gpu_model="H100")
    for name in nodes:
        node = Node(name=name, pool="default",
                    gpus=[GpuDevice(index=i, uuid=f"GPU-{i}", model="H100") for i in range(GPUS_PER_NODE)])  # fmt: skip
        await bus.publish_nowait(ctx.names.inventory(name), NodeInventory(node=node, pool=pool, observed_at=0.0))
    health = Health(ctx, bus, ledger)
    await health.start()
    stop = asyncio.Event()
    runner = asyncio.create_task(health.run(stop))
    verdicts: list[tuple[float, GpuHealthVerdict]] = []
    decoder = Decoder(GpuHealthVerdict)

    async def on_verdict(msg: Any) -> None:
        verdicts.append((time.monotonic(), decoder.decode(msg.data)))

    sub = await bus.nc.subscribe(ctx.names.subject("health.verdicts.>"), cb=on_verdict)
    healthy = [_healthy(i) for i in range(GPUS_PER_NODE)]
    injected: dict[tuple[str, int], float] = {}
    rng = random.Random(7)
    pending_faults: list[tuple[str, int]] = [(n, rng.randrange(GPUS_PER_NODE)) for n in rng.sample(nodes, faults)]

    async def publish_second(with_faults: bool) -> None:
        start = time.monotonic()
        for i, name in enumerate(nodes):
            delay = start + i / len(nodes) - time.monotonic()
            if delay > 0.002:
                await asyncio.sleep(delay)
            samples = healthy
            if with_faults and pending_faults and i % max(1, len(nodes) // 2) == 0:
                fnode, fgpu = pending_faults.pop()
                bad = [s if s.index != fgpu else GpuSample(index=fgpu, uuid=f"GPU-{fgpu}", ecc_dbe_volatile=1)
                       for s in healthy]  # fmt: skip
                injected[(fnode, fgpu)] = time.monotonic()
                await bus.publish_nowait(ctx.names.telemetry(fnode), NodeTelemetry(
                    node=fnode, sampled_at=time.time(), interval_s=1.0, gpus=bad))  # fmt: skip
            await bus.publish_nowait(
                ctx.names.telemetry(name),
                NodeTelemetry(node=name, sampled_at=time.time(), interval_s=1.0, gpus=samples),
            )
        await asyncio.sleep(max(0.0, start + 1 - time.monotonic()))

    for _ in range(int(quiet_s)):
        await publish_second(False)
    false_quarantines = sum(v.state == HealthState.QUARANTINED for _, v in verdicts)
    verdicts.clear()
    while pending_faults:
        await publish_second(True)
    await publish_second(False)
    await asyncio.sleep(2.0)
    latencies = []
    cordoned = (await ledger.snapshot()).cordoned
    for seen, v in verdicts:
        key = (v.node, v.gpu_index if v.gpu_index is not None else -1)
        if v.state == HealthState.QUARANTINED and key in injected:
            latencies.append((seen - injected.pop(key)) * 1000)
    in_ledger = sum(f"{n}/{g}" in cordoned for n, g in [(v.node, v.gpu_index) for _, v in verdicts])
    await sub.unsubscribe()
    stop.set()
    await runner
    await bus.close()
    await ledger.close()
    latencies.sort()
    return {
        "gpus": gpus,
        "quiet_s": quiet_s,
        "false_quarantines": false_quarantines,
        "faults_injected": faults,
        "faults_quarantined": len(latencies),
        "cordoned_in_ledger": in_ledger,
        "detect_to_quarantine_p50_ms": round(statistics.median(latencies), 1) if latencies else -1,
        "detect_to_quarantine_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)
        if latencies
        else -1,
    }


async def _cleanup(settings: Settings) -> None:
    await delete_namespace(settings.nats_url, settings.redis_url, settings.namespace)


def run(gpus: int = 10_000, quiet_s: float = 15.0, faults: int = 40) -> dict[str, float]:
    from chamber.cli.infra import resolve
    from chamber.common.ledger import Ledger

    infra = resolve()
    try:
        settings = Settings.from_env(nats_url=infra.nats_url, redis_url=infra.redis_url,
                                     namespace=f"bench{uuid.uuid4().hex[:8]}")  # fmt: skip

        async def go() -> dict[str, float]:
            ledger = Ledger.from_url(settings.redis_url, Names(settings.namespace).redis_prefix())
            await ledger.rebuild([])
            await ledger.close()
            try:
                return await _run(settings, gpus, quiet_s, faults)
            finally:
                await _cleanup(settings)

        return asyncio.run(go())
    finally:
        infra.stop()
