"""The fleet metrics aggregator: every node's telemetry in, fleet metrics, rollups and `/metrics` out.

It listens to telemetry on plain NATS subscriptions (no acks, lowest latency): its state is a rolling view that a
restart rebuilds within one interval, so it needs no durable consumer. Every `metrics_interval_s` it joins the
latest samples with the ledger (who holds which GPU) and the job records (teams, the queue) and publishes a
`FleetSnapshot`; finished rollup buckets are published for the history API.
"""

import asyncio
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from chamber.collector.core.metrics import FleetMetrics, PoolPrice
from chamber.collector.core.rollups import Rollups
from chamber.collector.prometheus import ChamberCollector
from chamber.common.bus import Bus, PublishError
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import FleetSnapshot, JobRecord, JobState, NodeInventory, NodeTelemetry, TelemetryEvent
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Ledger, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.metrics_names import METRICS
from chamber.common.runtime import Context, wait_event

log = get_logger(__name__)
_telemetry = Decoder(TelemetryEvent)


class Aggregator:
    def __init__(self, ctx: Context, bus: Bus, ledger: Ledger, store: JobStore) -> None:
        self.ctx = ctx
        self.bus = bus
        self.ledger = ledger
        self.store = store
        self.metrics = FleetMetrics()
        self.rollups = Rollups()
        self.inventory: dict[str, NodeInventory] = {}
        self.records: dict[str, JobRecord] = {}
        self.latest: FleetSnapshot | None = None
        self.rejected = 0
        self.lags_ms: list[float] = []
        """Sample time to the snapshot that first reflects it, per batch (for the benchmark)."""
        self._pending_times: list[float] = []
        self._subs: list[Any] = []
        self._stop_follow: Callable[[], Any] | None = None
        self._http: Any = None

    async def start(self, *, serve_metrics: bool = True) -> None:
        self._subs.append(await self.bus.nc.subscribe(
            self.bus.names.subject("telemetry.>"), cb=self._on_msg, pending_msgs_limit=1_000_000,
            pending_bytes_limit=1024 * 1024 * 1024,
        ))  # fmt: skip
        await self.bus.watch_latest(self.bus.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        self._stop_follow = await self.store.follow(self._on_record)
        if serve_metrics:
            registry = CollectorRegistry()
            registry.register(ChamberCollector(self.metrics, self._model_of, lambda: self.latest))
            self._http, _ = start_http_server(self.ctx.settings.metrics_port, self.ctx.settings.http_host, registry)
            log.info("collector.metrics_listening", port=self._http.server_port)

    @property
    def metrics_port(self) -> int:
        return int(self._http.server_port) if self._http is not None else 0

    async def _on_msg(self, msg: Any) -> None:
        try:
            event = _telemetry.decode(msg.data)
        except DecodeError:
            self.rejected += 1
            return
        if isinstance(event, NodeTelemetry):
            self.metrics.ingest(event)
            self._pending_times.append(event.sampled_at)

    def _on_inventory(self, inv: NodeInventory) -> None:
        self.inventory[inv.node.name] = inv

    def _on_record(self, record: JobRecord) -> None:
        self.records[record.id] = record

    def _model_of(self, slot: str) -> str:
        node, _, index = slot.rpartition("/")
        inv = self.inventory.get(node)
        if inv is None:
            return ""
        return next((g.model for g in inv.node.gpus if str(g.index) == index), "")

    async def tick(self) -> FleetSnapshot:
        try:
            snap = await self.ledger.snapshot()
            owners, cordoned = snap.owners, list(snap.cordoned)
        except LedgerUnavailable:
            owners, cordoned = {}, []
        allocation = {}
        for slot, holder in owners.items():
            job = holder.rsplit("/", 1)[0]
            record = self.records.get(job)
            allocation[slot] = (job, record.spec.team if record else "")
        inventory = [
            (f"{name}/{g.index}", inv.node.pool) for name, inv in self.inventory.items() for g in inv.node.gpus
        ]
        prices = {
            inv.pool.name: PoolPrice(inv.pool.name, inv.pool.cluster, inv.pool.cost_per_gpu_hour)
            for inv in self.inventory.values()
        }
        queue = [
            (r.spec.team, r.spec.priority)
            for r in self.records.values()
            if r.state in (JobState.PENDING, JobState.PREEMPTED) and r.placement is None
        ]
        now = self.ctx.clock.now()
        fleet = self.metrics.snapshot(
            now, inventory=inventory, allocation=allocation, cordoned=cordoned, prices=prices, queue=queue
        )
        wall = time.time()
        self.lags_ms.extend((wall - t) * 1000 for t in self._pending_times)
        self._pending_times.clear()
        self.latest = fleet
        closed = self.rollups.add(now, {k: getattr(fleet, k) for k in METRICS})
        try:
            await self.bus.publish(self.bus.names.subject("metrics.fleet"), fleet)
            for point in closed:
                await self.bus.publish(self.bus.names.subject(f"metrics.rollup.{point.resolution}"), point)
        except PublishError as exc:
            log.warning("collector.metrics_publish_failed", error=str(exc))
        return fleet

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_event(stop, self.ctx.settings.metrics_interval_s)
            try:
                await self.tick()
            except Exception:
                log.exception("collector.metrics_tick_failed")

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        if self._stop_follow is not None:
            await self._stop_follow()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
