"""The collector shell, in one of its roles (`CHAMBER_COLLECTOR_ROLE`):

- `agent`: a node agent (a DaemonSet pod per GPU node): this node's GPUs through NVML, XIDs pushed at once;
  with `CHAMBER_EXECUTOR=process` it also runs the jobs placed on the node (`chamber.collector.agent`);
- `local`: `agent` and `aggregator` together (one GPU server: what `chamber up` runs where NVML finds GPUs);
- `sim`: the simulated fleet, whose activity follows the jobs the ledger says hold each GPU;
- `aggregator`: fleet metrics from everyone's telemetry, rollups, Prometheus `/metrics`;
- `all` (default, what `chamber up` runs): `sim` and `aggregator` together; with `CHAMBER_EXECUTOR=process`,
  each simulated node gets a local job runner, so jobs run as real processes on this machine.

A source publishes each node's inventory at start and every `inventory_interval_s` (a heartbeat), and one
telemetry batch per node every `telemetry_interval_s`. Only the simulated fleet reads the ledger (its GPUs are
busy when a job holds them); a node agent reads its GPUs and nothing else, so 12,500 agents put no load on Redis.
"""

import asyncio
import socket
from typing import TYPE_CHECKING, Any

from chamber.collector.agent.host import start_runners
from chamber.collector.agent.server import AgentServer
from chamber.collector.aggregator import Aggregator
from chamber.collector.core.simfleet import FleetShape, PoolShape, SimulatedFleet
from chamber.collector.core.source import TelemetryOnly, TelemetrySource
from chamber.common.bus import Bus, PublishError
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import FaultInjection, Node, Pool, TopologyLabels, to_columns
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Ledger, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.runtime import Context, wait_event

if TYPE_CHECKING:
    from chamber.collector.agent.kubelet import Assignments

log = get_logger(__name__)


class Collector:
    def __init__(self, ctx: Context, bus: Bus, source: TelemetrySource, *, ledger: Ledger | None = None) -> None:
        """`ledger`: where a simulated source learns which GPUs jobs hold; None for a real node agent."""
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
        allocation: dict[str, str] = {}
        if self.ledger is not None:
            try:
                owners = (await self.ledger.snapshot()).owners
            except LedgerUnavailable:
                owners = {}
            allocation = {slot: holder.rsplit("/", 1)[0] for slot, holder in owners.items()}
        for batch in self.source.sample(now, allocation):
            await self.bus.publish_nowait(self.bus.names.telemetry(batch.node), to_columns(batch))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.tick()
            except PublishError as exc:
                log.warning("collector.publish_failed", error=str(exc))
            await wait_event(stop, self.ctx.settings.telemetry_interval_s)


async def follow_faults(ctx: Context, bus: Bus, fleet: SimulatedFleet) -> Any:
    """Apply fault injections to the simulated fleet as they arrive (garbage is logged and skipped)."""
    decoder = Decoder(FaultInjection)

    async def on_msg(msg: Any) -> None:
        try:
            fault: FaultInjection = decoder.decode(msg.data)
        except DecodeError as exc:
            log.warning("collector.bad_fault_injection", error=str(exc))
            return
        if fault.fault == "clear":
            fleet.clear(fault.node, fault.gpu)
            return
        until = None if fault.duration_s is None else ctx.clock.now() + fault.duration_s
        try:
            fleet.inject(fault.node, fault.gpu, fault.fault, value=fault.value, until=until)
        except ValueError as exc:
            log.warning("collector.bad_fault_injection", error=str(exc))
            return
        log.warning("collector.fault_injected", node=fault.node, gpu=fault.gpu, fault=fault.fault)

    return await bus.nc.subscribe(bus.names.subject("control.sim.faults"), cb=on_msg)


def simulated_source(ctx: Context) -> SimulatedFleet:
    s = ctx.settings
    shape = FleetShape(
        nodes=s.fleet_nodes,
        gpus_per_node=s.gpus_per_node,
        nodes_per_rack=s.nodes_per_rack,
        gpu_model=s.gpu_model,
        pool=s.pool,
        cost_per_gpu_hour=s.pool_cost_per_gpu_hour,
        interval_s=s.telemetry_interval_s,
        pools=tuple(PoolShape(name, model, nodes, cost) for name, model, nodes, cost in s.pools()),
    )
    return SimulatedFleet(shape, seed=s.seed)


async def _agent(ctx: Context, bus: Bus, stop: asyncio.Event) -> None:
    from chamber.collector.nvml import NvmlReader, NvmlSource, XidWatcher, load_nvml

    s = ctx.settings
    nvml = load_nvml(s.nvml_module)
    node = s.node_name or socket.gethostname()
    reader = NvmlReader(nvml)
    devices = reader.devices()
    pool = Pool(name=s.pool, gpu_model=devices[0].model if devices else "", cost_per_gpu_hour=s.pool_cost_per_gpu_hour)
    source = NvmlSource(reader, node, pool, TopologyLabels(), s.telemetry_interval_s)
    runners = await _runners(ctx, bus, [source.node], local=False)
    if runners:
        source.owner = runners[0].owner
    assignments = _assignments(ctx, node, [g.uuid for g in source.node.gpus])
    if assignments is not None:
        source.assigned = lambda: assignments.latest
    published: TelemetrySource = TelemetryOnly(source) if s.inventory_source == "kubernetes" else source
    pending: set[asyncio.Task[object]] = set()

    def on_xid(index: int, xid: int) -> None:
        event = source.xid_event(index, xid, ctx.clock.now())
        task = asyncio.ensure_future(bus.publish(bus.names.telemetry(node), event))
        pending.add(task)
        task.add_done_callback(pending.discard)

    watcher = XidWatcher(nvml, reader.physical, on_xid, resolve=reader.xid_targets)
    watcher.start(asyncio.get_running_loop())
    reading = asyncio.create_task(assignments.run(stop)) if assignments is not None else None
    try:
        await Collector(ctx, bus, published).run(stop)
    finally:
        if reading is not None:
            await asyncio.gather(reading, return_exceptions=True)
        watcher.stop()
        for runner in runners:
            await runner.close()
        reader.close()


def _assignments(ctx: Context, node: str, devices: list[str]) -> "Assignments | None":
    """The kubelet read-back (`CHAMBER_POD_RESOURCES_SOCKET`), with this node's Chamber pods where the agent may
    read the API (`CHAMBER_KUBE_API`); None when off."""
    s = ctx.settings
    if not s.pod_resources_socket:
        return None
    from chamber.collector.agent.kubelet import Assignments, PodResourcesClient
    from chamber.common.kube.client import KubeClient

    kube = KubeClient.connect(s.kube_api) if s.kube_api else None
    return Assignments(PodResourcesClient(s.pod_resources_socket), node, devices, kube=kube,
                       interval_s=s.telemetry_interval_s)  # fmt: skip


async def _runners(ctx: Context, bus: Bus, nodes: list[Node], *, local: bool) -> list[AgentServer]:
    """Job runners for these nodes when jobs run as processes (`CHAMBER_EXECUTOR=process`); none otherwise."""
    if ctx.settings.executor != "process":
        return []
    return await start_runners(ctx, bus, nodes, local=local)


async def main(ctx: Context, stop: asyncio.Event) -> None:
    role = ctx.settings.collector_role
    if role not in ("all", "agent", "local", "sim", "aggregator"):
        raise ValueError(f"CHAMBER_COLLECTOR_ROLE={role!r}: use all, agent, local, sim or aggregator")
    bus = await ctx.bus()
    ledger = ctx.ledger() if role != "agent" else None
    aggregator = None
    tasks = []
    runners: list[AgentServer] = []
    try:
        if ledger is not None and role in ("all", "aggregator", "local"):
            aggregator = Aggregator(ctx, bus, ledger, await JobStore.open(bus))
            await aggregator.start()
            tasks.append(asyncio.create_task(aggregator.run(stop)))
        kube_inventory = ctx.settings.inventory_source == "kubernetes"
        if kube_inventory and ctx.settings.kube_api and role != "agent":
            from chamber.collector import kube_discovery

            tasks.append(asyncio.create_task(kube_discovery.run(ctx, bus, stop)))
        if ledger is not None and role in ("all", "sim"):
            fleet = simulated_source(ctx)
            await follow_faults(ctx, bus, fleet)
            runners = await _runners(ctx, bus, [inv.node for inv in fleet.inventory(ctx.clock.now())], local=True)
            source: TelemetrySource = TelemetryOnly(fleet) if kube_inventory else fleet
            tasks.append(asyncio.create_task(Collector(ctx, bus, source, ledger=ledger).run(stop)))
        if role in ("agent", "local"):
            tasks.append(asyncio.create_task(_agent(ctx, bus, stop)))
        await asyncio.gather(*tasks)
    finally:
        for runner in runners:
            await runner.close()
        if aggregator is not None:
            await aggregator.close()
        await bus.close()
        if ledger is not None:
            await ledger.close()
