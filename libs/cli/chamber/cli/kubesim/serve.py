"""`chamber kube-emulator`: the emulated API server and cluster on a port, until SIGINT/SIGTERM."""

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import kmock

from chamber.cli.kubesim.apiserver import ChamberKubeEmulator
from chamber.cli.kubesim.cluster import EmulatedCluster, node_objects
from chamber.collector.core.simfleet import FleetShape, PoolShape
from chamber.common.settings import Settings


@dataclass
class Running:
    url: str
    api: ChamberKubeEmulator
    cluster: EmulatedCluster


def fleet_shape(settings: Settings) -> FleetShape:
    return FleetShape(
        nodes=settings.fleet_nodes, gpus_per_node=settings.gpus_per_node, nodes_per_rack=settings.nodes_per_rack,
        gpu_model=settings.gpu_model, pool=settings.pool, cost_per_gpu_hour=settings.pool_cost_per_gpu_hour,
        pools=tuple(PoolShape(name, model, nodes, cost) for name, model, nodes, cost in settings.pools()),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def emulated_cluster(
    settings: Settings, *, host: str = "127.0.0.1", port: int = 0, webhook_url: str = "", tick_s: float = 0.1,
    grace_cap_s: float = 3.0, bookmark_interval_s: float = 5.0,
) -> AsyncIterator[Running]:  # fmt: skip
    """Serve an emulated cluster with the settings' fleet (the collector's simulated nodes) as its nodes, and
    Chamber's webhooks at `webhook_url`."""
    stop = asyncio.Event()
    async with (
        ChamberKubeEmulator(bookmark_interval_s=bookmark_interval_s) as api,
        kmock.Server(api, host=host, port=port or None) as server,
    ):
        cluster = EmulatedCluster(api, tick_s=tick_s, grace_cap_s=grace_cap_s)
        cluster.seed(node_objects(fleet_shape(settings), settings.seed), webhook_url)
        task = asyncio.create_task(cluster.run(stop))
        try:
            yield Running(str(server.url).rstrip("/"), api, cluster)
        finally:
            stop.set()
            await task


async def serve(settings: Settings, host: str, port: int, webhook_url: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with emulated_cluster(settings, host=host, port=port, webhook_url=webhook_url) as running:
        print(f"chamber: emulated Kubernetes API at {running.url} ({settings.fleet_nodes} nodes)", flush=True)
        await stop.wait()
