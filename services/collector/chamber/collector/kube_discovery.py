"""Kubernetes discovery: the cluster's GPU nodes as Chamber inventory, kept current as nodes join and leave.

Follows nodes with the reflector (list, watch, relist on 410) and publishes each node's `NodeInventory` on
`<ns>.inventory.<node>` when it appears or changes in a way that matters (GPU count, model, pool, topology,
readiness), and at least every `inventory_interval_s` as a heartbeat. A node that leaves or stops being Ready
gets an inventory without GPUs (its subject's last word), so nothing is placed there. Which labels are read:
`chamber.common.kube.nodes`.

With `CHAMBER_INVENTORY_SOURCE=kubernetes`, this is the only inventory publisher: telemetry sources (node agents,
the simulated fleet) publish telemetry only (`chamber.collector.core.source.TelemetryOnly`).
"""

import asyncio
import contextlib

from chamber.common.bus import Bus, BusError
from chamber.common.contracts import NodeInventory
from chamber.common.kube.client import NODES, KubeClient, Obj
from chamber.common.kube.nodes import gone, inventory
from chamber.common.kube.watch import Reflector
from chamber.common.kube.workloads import meta
from chamber.common.log import get_logger
from chamber.common.runtime import Context

log = get_logger(__name__)


class Discovery:
    def __init__(self, ctx: Context, bus: Bus, client: KubeClient) -> None:
        self.ctx = ctx
        self.bus = bus
        self.client = client
        self.published: dict[str, NodeInventory] = {}
        self.reflector = Reflector(client, NODES, self.on_node, name="nodes")

    def _inventory(self, node: Obj) -> NodeInventory:
        s = self.ctx.settings
        return inventory(node, default_pool=s.pool, pool_label=s.kube_pool_label,
                         cost_per_gpu_hour=s.pool_cost_per_gpu_hour, now=self.ctx.clock.now())  # fmt: skip

    async def on_node(self, kind: str, node: Obj) -> None:
        name = str(meta(node).get("name"))
        if kind == "DELETED":
            known = self.published.get(name)
            inv = gone(name, pool=known.node.pool if known else self.ctx.settings.pool, now=self.ctx.clock.now())
            log.info("kube_discovery.node_left", node=name)
        else:
            inv = self._inventory(node)
            known = self.published.get(name)
            if known is not None and known.node == inv.node and known.pool == inv.pool:
                return
            if known is None and not inv.node.gpus:
                return  # not a GPU node, and never was one
            log.info("kube_discovery.node", node=name, gpus=len(inv.node.gpus), pool=inv.node.pool,
                     model=inv.pool.gpu_model, cloud=inv.node.cluster)  # fmt: skip
        await self._publish(inv)

    async def _publish(self, inv: NodeInventory) -> None:
        try:
            await self.bus.publish(self.bus.names.inventory(inv.node.name), inv)
            self.published[inv.node.name] = inv
        except BusError as exc:
            log.warning("kube_discovery.publish_failed", node=inv.node.name, error=str(exc))

    async def heartbeat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.ctx.settings.inventory_interval_s)
            now = self.ctx.clock.now()
            for inv in list(self.published.values()):
                if inv.node.gpus:
                    await self._publish(NodeInventory(node=inv.node, pool=inv.pool, observed_at=now))

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(self.reflector.run(stop), self.heartbeat(stop))


async def run(ctx: Context, bus: Bus, stop: asyncio.Event) -> None:
    client = KubeClient.connect(ctx.settings.kube_api)
    try:
        await Discovery(ctx, bus, client).run(stop)
    finally:
        await client.close()
