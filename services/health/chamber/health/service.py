"""The health shell: consume telemetry, evaluate, cordon quarantined GPUs in the ledger, publish verdicts.

Cordons are re-asserted every few seconds, so a ledger that lost its data (Redis restart) gets them back.
"""

import asyncio

from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import GpuHealthVerdict, GpuXidEvent, HealthState, NodeTelemetry, TelemetryEvent
from chamber.common.ledger import Ledger, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import HEALTH, TELEMETRY
from chamber.health.core.rules import as_batch, evaluate

log = get_logger(__name__)

REASSERT_INTERVAL_S = 5.0


def cordon_reason(reason: str) -> str:
    """Cordons from these rules are fatal: the scheduler interrupts the GPU's job at once, without grace."""
    return f"fatal: health: {reason}"


class Health:
    def __init__(self, ctx: Context, bus: Bus, ledger: Ledger) -> None:
        self.ctx = ctx
        self.bus = bus
        self.ledger = ledger
        self.states: dict[tuple[str, int], HealthState] = {}
        self.reasons: dict[str, str] = {}

    async def start(self) -> None:
        for verdict in await self.bus.read_latest(
            HEALTH, self.bus.names.subject("health.verdicts.>"), Decoder(GpuHealthVerdict)
        ):
            if verdict.gpu_index is not None:
                self._remember(verdict)
        await self.reassert()
        consumer = self.bus.consumer(
            stream=TELEMETRY,
            durable="health",
            filter_subjects=[self.bus.names.subject("telemetry.>")],
            decoder=Decoder(TelemetryEvent),
            handler=self.on_telemetry,
        )
        await consumer.start()

    def _remember(self, verdict: GpuHealthVerdict) -> None:
        assert verdict.gpu_index is not None
        self.states[(verdict.node, verdict.gpu_index)] = verdict.state
        slot = f"{verdict.node}/{verdict.gpu_index}"
        if verdict.state == HealthState.QUARANTINED:
            self.reasons[slot] = verdict.reason
        else:
            self.reasons.pop(slot, None)

    async def on_telemetry(self, event: NodeTelemetry | GpuXidEvent) -> None:
        batch = event if isinstance(event, NodeTelemetry) else as_batch(event)
        for verdict in evaluate(batch, self.states):
            slot = f"{verdict.node}/{verdict.gpu_index}"
            await self.ledger.cordon([slot], cordon_reason(verdict.reason))
            await self.bus.publish(
                self.bus.names.health_verdict(verdict.node, verdict.gpu_index),
                verdict,
                msg_id=f"{slot}:{verdict.state}:{verdict.observed_at}",
            )
            self._remember(verdict)
            log.warning("health.quarantined", slot=slot, reason=verdict.reason)

    async def reassert(self) -> None:
        by_reason: dict[str, list[str]] = {}
        for slot, reason in self.reasons.items():
            by_reason.setdefault(cordon_reason(reason), []).append(slot)
        for reason, slots in by_reason.items():
            await self.ledger.cordon(slots, reason)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_event(stop, REASSERT_INTERVAL_S)
            try:
                await self.reassert()
            except LedgerUnavailable as exc:
                log.warning("health.ledger_unavailable", error=str(exc))


async def main(ctx: Context, stop: asyncio.Event) -> None:
    bus = await ctx.bus()
    ledger = ctx.ledger()
    health = Health(ctx, bus, ledger)
    try:
        await health.start()
        await health.run(stop)
    finally:
        await bus.close()
        await ledger.close()
