"""Running a service process: logging, tracing, signals, and the shared connections every shell needs."""

import asyncio
import gc
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chamber.common.alive import beat
from chamber.common.bus import Bus
from chamber.common.clock import Clock, SystemClock
from chamber.common.ledger import Ledger
from chamber.common.log import get_logger, setup_logging
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from chamber.common.tracing import setup_tracing

log = get_logger(__name__)


@dataclass
class Context:
    """What a service shell gets: settings, names, clock, and (opened on demand) the bus and the ledger."""

    settings: Settings
    service: str
    clock: Clock
    names: Names

    async def bus(self) -> Bus:
        bus = await Bus.connect(
            self.settings.nats_url, self.names, self.service, replicas=self.settings.nats_replicas,
            direct=self.settings.nats_direct_publish,
        )  # fmt: skip
        await bus.ensure_streams()
        return bus

    def ledger(self) -> Ledger:
        return Ledger.from_url(self.settings.redis_url, self.names.redis_prefix())


ServiceMain = Callable[[Context, asyncio.Event], Coroutine[Any, Any, None]]


def make_context(settings: Settings, service: str, clock: Clock | None = None) -> Context:
    return Context(settings, service, clock or SystemClock(), Names(settings.namespace))


def run_service(service: str, main: ServiceMain, settings: Settings) -> None:
    """Run `main` until SIGINT or SIGTERM, then let it shut down cleanly."""
    setup_logging(settings.log_level, settings.log_format, service)
    setup_tracing(service, settings.otel_exporter)
    _tune_gc()
    with asyncio.Runner(loop_factory=loop_factory()) as loop_runner:
        loop_runner.run(serve(service, main, settings))


async def serve(service: str, main: ServiceMain, settings: Settings) -> None:
    """`main` on this loop, stopped by SIGINT or SIGTERM, its liveness file (`CHAMBER_ALIVE_FILE`) touched while it
    runs (`chamber.common.alive`)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("service.starting", namespace=settings.namespace)
    heartbeat = asyncio.create_task(beat(Path(settings.alive_file))) if settings.alive_file else None
    try:
        await main(make_context(settings, service), stop)
    finally:
        if heartbeat is not None:
            heartbeat.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    log.info("service.stopped")


GC_THRESHOLDS = (20_000, 20, 10)
"""Python's default (700, 10, 10) collects the young generation every 700 net allocations: a service handling
thousands of messages a second then spends 6-12% of its CPU in the collector, mostly scanning in-flight messages
that would have died a moment later, and promotes them to older generations that are scanned again (measured
during `chamber bench e2e`: 0.26 s of the scheduler's 4.4 s; 0.04 s with these thresholds)."""


def _tune_gc() -> None:
    """Collect less often, and never re-scan what start-up imported (it lives as long as the process)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed (a faster event loop: the gateway's reads and NATS I/O gain most, and a load
    generator takes less of the cores it shares), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passes; True when it was set. The loop tick of every shell."""
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout_s)
    except TimeoutError:
        return False
    return True
