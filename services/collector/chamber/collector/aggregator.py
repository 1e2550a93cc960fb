"""The fleet metrics aggregator: every node's telemetry in, fleet metrics, rollups and `/metrics` out.

It listens to telemetry on a plain core-NATS subscription (no acks, lowest latency): its state is a rolling view
that a restart rebuilds within one interval, so it needs no durable consumer. 12,500 nodes send 12,500 messages
a second, so the subscription is a `Firehose` (payloads read from the socket in bulk, no per-message objects;
the nats-py subscription only where it cannot be used, e.g. TLS); each slice of up to 2,000 messages is decoded
into the lean `NodeColumnsActivityView` (only the columns fleet metrics use; `NodeActivityView` for the row form)
and applied at once, and the event loop gets control back between slices so the tick runs on time under any load;
the bytes are kept for `/metrics`.
Inventory and job records are applied as they change (who holds which GPU comes from the records' placements, the
same claims the ledger holds); every `metrics_interval_s` a `FleetSnapshot` is published, with the rollup
buckets it closed; the cordons are read from the ledger every 5 s.
"""

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import nats.errors
import numpy as np
from prometheus_client import CollectorRegistry, start_http_server

from chamber.collector.core.lag import LagHistogram
from chamber.collector.core.metrics import Batch, FleetMetrics, PoolPrice
from chamber.collector.core.rollups import DAY_S, MINUTE, Rollups
from chamber.collector.prometheus import ChamberCollector
from chamber.common.bus import Bus, BusError, PublishError
from chamber.common.bus.firehose import Firehose, supported
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import (
    FleetSnapshot,
    JobRecord,
    NodeInventory,
    RollupPoint,
    TelemetryActivityView,
    XidEventView,
)
from chamber.common.jobstore import JobStore
from chamber.common.ledger import Ledger, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.metrics_names import METRICS
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import METRICS as METRICS_STREAM

log = get_logger(__name__)
_telemetry = Decoder(TelemetryActivityView)
_rollup = Decoder(RollupPoint)
CORDONS_REFRESH_S = 5.0
"""Cordons are read from the ledger this often, not at every tick: parsing them costs more than a snapshot, and
health itself re-asserts them only every 5 s."""


class Aggregator:
    def __init__(self, ctx: Context, bus: Bus, ledger: Ledger, store: JobStore) -> None:
        self.ctx = ctx
        self.bus = bus
        self.ledger = ledger
        self.store = store
        self.metrics = FleetMetrics()
        self.rollups = Rollups()
        self.inventory: dict[str, NodeInventory] = {}
        self.latest: FleetSnapshot | None = None
        self.rejected = 0
        self.lag = LagHistogram()
        """Sample time to the first snapshot that includes it, per GPU sample."""
        self.snapshot_ms: deque[float] = deque(maxlen=10_000)
        """How long each tick took to build its snapshot (the last 10,000)."""
        self.snapshot_cpu_ms: deque[float] = deque(maxlen=10_000)
        """The same in CPU time (what it costs, however busy the machine is)."""
        self._subs: list[Any] = []
        self._stop_follow: Callable[[], Any] | None = None
        self._http: Any = None
        self._cordons_at = float("-inf")
        self.firehose: Firehose | None = None

    async def start(self, *, serve_metrics: bool = True) -> None:
        subject, url = self.bus.names.subject("telemetry.>"), self.ctx.settings.nats_url
        if supported(url):
            firehose = Firehose(url, subject, self._on_payloads, name=f"chamber-{self.bus.service}-telemetry")
            try:
                await firehose.start()
                self.firehose = firehose
            except (OSError, ConnectionError, TimeoutError) as exc:
                log.warning("collector.firehose_unavailable", error=str(exc))
        if self.firehose is None:
            self._subs.append(await self.bus.nc.subscribe(
                subject, cb=self._on_msg, pending_msgs_limit=1_000_000, pending_bytes_limit=1024 * 1024 * 1024,
            ))  # fmt: skip
        await self.bus.watch_latest(self.bus.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        self._stop_follow = await self.store.follow(self._on_record)
        await self._restore_rollups()
        if serve_metrics:
            registry = CollectorRegistry()
            registry.register(ChamberCollector(self.metrics, self._model_of, lambda: self.latest))
            self._http, _ = start_http_server(self.ctx.settings.metrics_port, self.ctx.settings.http_host, registry)
            log.info("collector.metrics_listening", port=self._http.server_port)

    async def _restore_rollups(self) -> None:
        """The hour's and the day's rollups so far, from the minutes this collector (or the one before it) published:
        a restart used to begin them anew, so the day's point after a restart at 18:00 was the mean of six hours."""
        subject = self.bus.names.subject(f"metrics.rollup.{MINUTE}")
        try:
            # (`since` is a time of storing, on this machine's clock; the points' own times say which bucket)
            minutes = await self.bus.read_since(METRICS_STREAM, subject, time.time() - DAY_S - 120, _rollup)
        except (BusError, nats.errors.Error, TimeoutError) as exc:  # (the rollups start anew, as they did before)
            log.warning("collector.rollups_not_restored", error=str(exc))
            return
        restored = self.rollups.restore(minutes, self.ctx.clock.now())
        if restored:
            log.info("collector.rollups_restored", minutes=restored)

    @property
    def metrics_port(self) -> int:
        return int(self._http.server_port) if self._http is not None else 0

    async def _on_msg(self, msg: Any) -> None:
        self._on_payloads([msg.data])

    def _on_payloads(self, payloads: list[bytes]) -> None:
        """Ingest the node batches among a slice of telemetry messages at once (decoded one by one as read)."""
        self.metrics.ingest_many(self._decoded(payloads))

    def _decoded(self, payloads: list[bytes]) -> Iterator[tuple[Batch, bytes]]:
        decode = _telemetry.decode
        for data in payloads:
            try:
                event = decode(data)
            except DecodeError:
                self.rejected += 1
                continue
            if type(event) is XidEventView:
                self.metrics.note_xid(event.node, event.gpu_index, event.xid)
            else:
                yield event, data

    def _on_inventory(self, inv: NodeInventory) -> None:
        self.inventory[inv.node.name] = inv
        self.metrics.set_price(PoolPrice(inv.pool.name, inv.pool.cluster, inv.pool.cost_per_gpu_hour))
        self.metrics.set_inventory(inv.node.name, inv.node.pool, [g.index for g in inv.node.gpus])

    def _on_record(self, record: JobRecord) -> None:
        self.metrics.on_record(record)

    def _model_of(self, node: str, index: int) -> str:
        inv = self.inventory.get(node)
        if inv is None:
            return ""
        return next((g.model for g in inv.node.gpus if g.index == index), "")

    async def tick(self) -> FleetSnapshot:
        now = self.ctx.clock.now()
        if now - self._cordons_at >= CORDONS_REFRESH_S:
            try:
                self.metrics.set_cordoned(await self.ledger.cordons())
                self._cordons_at = now
            except LedgerUnavailable as exc:
                log.warning("collector.ledger_unavailable", error=str(exc))
        started, started_cpu = time.perf_counter(), time.thread_time()
        fleet = self.metrics.snapshot(now)
        reported_at, reported_gpus = self.metrics.take_reported()
        self.latest = fleet
        closed = self.rollups.add(now, {k: getattr(fleet, k) for k in METRICS})
        self.snapshot_ms.append((time.perf_counter() - started) * 1000)
        self.snapshot_cpu_ms.append((time.thread_time() - started_cpu) * 1000)
        try:
            await self.bus.publish(self.bus.names.subject("metrics.fleet"), fleet)
            for point in closed:
                await self.bus.publish(self.bus.names.subject(f"metrics.rollup.{point.resolution}"), point)
        except PublishError as exc:
            log.warning("collector.metrics_publish_failed", error=str(exc))
        if reported_at:
            self.lag.add((time.time() - np.array(reported_at)) * 1000, reported_gpus)
        return fleet

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_event(stop, self.ctx.settings.metrics_interval_s)
            try:
                await self.tick()
            except Exception:
                log.exception("collector.metrics_tick_failed")

    async def close(self) -> None:
        if self.firehose is not None:
            await self.firehose.close()
        for sub in self._subs:
            await sub.unsubscribe()
        if self._stop_follow is not None:
            await self._stop_follow()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
