"""The collector on real NATS and Redis: fleet metrics in the API, history, and dcgm-exporter-style /metrics."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from chamber.collector.aggregator import Aggregator
from chamber.collector.service import Collector, simulated_source
from chamber.common.bus import Bus
from chamber.common.jobstore import JobStore
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from chamber.scheduler import service as scheduler
from tests.support.gateway import gateway_client
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(settings: Settings, cleanup: None) -> AsyncIterator[AsyncTestClient[Any]]:
    async with gateway_client(settings) as c:
        yield c


async def test_fleet_metrics_history_and_prometheus(client: AsyncTestClient[Any], settings: Settings) -> None:
    ctx = make_context(settings, "collector")
    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "collector")
    await bus.ensure_streams()
    ledger = ctx.ledger()
    aggregator = Aggregator(ctx, bus, ledger, await JobStore.open(bus))
    await aggregator.start()
    sim = Collector(ctx, bus, simulated_source(ctx), ledger=ledger)
    try:
        async with running(settings, ("scheduler", scheduler.main)):
            await sim.tick()
            job = {"name": "train", "team": "nlp", "gpus_per_replica": 8, "duration_s": 30}
            assert (await client.post("/v1/jobs", json=job)).status_code == 201

            async def busy() -> bool:
                await sim.tick()
                await aggregator.tick()
                fleet = (await client.get("/v1/fleet")).json()
                # The allocation is the ledger's, the rest the latest fleet snapshot the gateway got: wait for one
                # built after the samples arrived (the first tick may run before NATS delivered them).
                # (the simulated job may be an idle notebook, so utilization itself may be 0)
                return bool(fleet["gpus_allocated"] == 8 and fleet["gpus_healthy"] == 32)

            await eventually(busy, what="the fleet shows the busy GPUs")
            fleet = (await client.get("/v1/fleet")).json()
            assert fleet["gpus_total"] == 32
            assert fleet["utilization"] is not None
            assert 0 <= fleet["efficiency_score"] <= 100
            assert fleet["idle_ratio"] >= 24 / 32, "24 GPUs are unallocated"
            assert 24 * 2.5 <= fleet["idle_cost_per_hour"] <= 32 * 2.5, "unallocated, plus the job's GPUs if idle"
            history = (await client.get("/v1/fleet/history", params={"metric": "utilization", "window": "1h"})).json()
            assert history["resolution"] == "1m"
            assert history["points"]
            assert (await client.get("/v1/fleet/history", params={"metric": "nope"})).status_code == 400
            assert (await client.get("/v1/fleet/history", params={"window": "forever"})).status_code == 400
            url = f"http://127.0.0.1:{aggregator.metrics_port}/metrics"
            async with httpx.AsyncClient() as http:
                text = (await http.get(url, timeout=5)).text
            assert 'DCGM_FI_DEV_GPU_UTIL{Hostname="node-0000",UUID="GPU-' in text
            assert 'modelName="H100"' in text
            assert "DCGM_FI_DEV_FB_USED" in text
            assert "chamber_fleet_efficiency_score" in text
            assert "chamber_queue_depth_by_team" in text
    finally:
        await aggregator.close()
        await bus.close()
        await ledger.close()


async def test_a_restarted_collector_takes_its_hour_and_day_back_from_the_minutes_on_the_stream(
    settings: Settings, cleanup: None
) -> None:
    """The minutes the collector published before a restart (this hour's, this day's), read back from METRICS."""
    from chamber.common.clock import FakeClock
    from chamber.common.contracts import RollupPoint
    from chamber.common.metrics_names import METRICS

    clock = FakeClock(86400.0 * 20_000 + 3600 * 6 + 60 * 17 + 5)  # 06:17:05
    ctx = make_context(settings, "collector", clock)
    bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "collector")
    await bus.ensure_streams()
    values = dict.fromkeys(METRICS, 0.0) | {"idle_ratio": 0.25, "gpus_healthy": 100.0, "queue_depth": 3.0}
    # 06:16, 06:15, 06:01 and 06:00 this hour, 05:59 earlier today, 23:17 yesterday:
    starts = [clock.now() - 60 * m - 5 for m in (1, 2, 16, 17, 18, 60 * 7)]
    for start in starts:
        point = RollupPoint(resolution="1m", start=start, values=values, samples=4)
        await bus.publish(bus.names.subject("metrics.rollup.1m"), point)
    await bus.publish_raw(bus.names.subject("metrics.rollup.1m"), b"not a point")
    ledger = ctx.ledger()
    aggregator = Aggregator(ctx, bus, ledger, await JobStore.open(bus))
    try:
        await aggregator.start(serve_metrics=False)
        assert aggregator.rollups.series("idle_ratio", "1h", since=0.0) == [(clock.now() - 17 * 60 - 5, 0.25)]
        assert aggregator.rollups.series("queue_depth", "1d", since=0.0)[0][1] == 3.0
        assert aggregator.rollups._open["1h"].samples == 4 * 4
        assert aggregator.rollups._open["1d"].samples == 5 * 4, "yesterday's minute is not today's"
    finally:
        await aggregator.close()
        await bus.close()
        await ledger.close()
