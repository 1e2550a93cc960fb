"""The collector shell: every interval, sample the source and publish one telemetry batch per node;
publish each node's inventory at start, on change and every `inventory_interval_s` (a heartbeat)."""

import asyncio

from chamber.collector.core.simfleet import FleetShape, SimulatedFleet
from chamber.collector.core.source import TelemetrySource
from chamber.common.bus import Bus, PublishError
from chamber.common.ledger import Ledger, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.runtime import Context, wait_event

log = get_logger(__name__)


class Collector:
    def __init__(self, ctx: Context, bus: Bus, ledger: Ledger, source: TelemetrySource) -> None:
        self.ctx = ctx
        self.bus = bus
        self.ledger = ledger
        self.source = source
        self._last_inventory_at = float("-inf")

    async def publish_inventory(self) -> None:
        now = self.ctx.clock.now()
        for inv in self.source.inventory(now):
            await self.bus.publish(self.bus.names.inventory(inv.node.name), inv)
        self._last_inventory_at = now

    async def tick(self) -> None:
        now = self.ctx.clock.now()
        if now - self._last_inventory_at >= self.ctx.settings.inventory_interval_s:
            await self.publish_inventory()
        try:
            busy = frozenset((await self.ledger.snapshot()).owners)
        except LedgerUnavailable:
            busy = frozenset()
        for batch in self.source.sample(now, busy):
            await self.bus.publish(self.bus.names.telemetry(batch.node), batch)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except PublishError as exc:
                log.warning("collector.publish_failed", error=str(exc))
            await wait_event(stop, self.ctx.settings.telemetry_interval_s)


def simulated_source(ctx: Context) -> SimulatedFleet:
    s = ctx.settings
    shape = FleetShape(
        nodes=s.fleet_nodes,
        gpus_per_node=s.gpus_per_node,
        nodes_per_rack=s.nodes_per_rack,
        gpu_model=s.gpu_model,
        interval_s=s.telemetry_interval_s,
    )
    return SimulatedFleet(shape, seed=s.seed)


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    ledger = ctx.ledger()
    collector = Collector(ctx, bus, ledger, simulated_source(ctx))
    try:
        await collector.run(stop)
    finally:
        await bus.close()
        await ledger.close()
