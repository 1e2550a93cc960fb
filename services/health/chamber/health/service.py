"""The health shell: telemetry and operator commands in, verdicts out; quarantines become ledger cordons.

Every verdict goes to the durable HEALTH stream (the audit trail) before its message is acked. The ledger's
health-owned cordons are reconciled with the engine's state every few seconds, so a ledger that lost its data
(Redis restart) gets them back, and a cordon whose entity recovered goes away.
"""

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from chamber.common.bus import Bus
from chamber.common.codec import Decoder
from chamber.common.contracts import (
    Cordon,
    GpuHealthVerdict,
    GpuXidEvent,
    HealthCommand,
    HealthState,
    NodeInventory,
    NodeTelemetry,
    NodeTelemetryColumns,
    TelemetryWire,
    as_telemetry,
)
from chamber.common.ledger import Ledger, LedgerUnavailable
from chamber.common.log import get_logger
from chamber.common.runtime import Context, wait_event
from chamber.common.subjects import HEALTH, TELEMETRY
from chamber.health.core.engine import Entity, HealthEngine, physical_gpus
from chamber.health.core.rules import DEFAULT_RULES, Rule, RuleError, as_batch, merge_rules

if TYPE_CHECKING:
    from chamber.health.kube_quarantine import NodeQuarantine

log = get_logger(__name__)

TELEMETRY_REMEMBERED = 2_000_000
"""Telemetry delivered again after it was handled is not counted again (the engine counts faults against windows:
an XID batch whose ack was lost in a NATS restart counted twice toward a quarantine), within this many stream
sequences of the newest: 12,500 nodes a second for more than twice the 30 s ack wait (`Consumer`'s `remember`)."""
COMMANDS_REMEMBERED = 100_000
"""An operator's order delivered again after it was handled (its ack lost) is not carried out again: a cordon
repeated after the release that followed it would take the GPU out again (`Consumer`'s `remember`)."""
RECONCILE_INTERVAL_S = 5.0
TICK_S = 0.25
"""Time-driven transitions (a silent node) are noticed within this of their moment."""
OWNER = "health"


def cordon_reason(entity: Entity) -> Cordon:
    """Fatal faults interrupt the GPU's jobs at once; degraded ones drain them with their checkpoint grace."""
    return Cordon(
        severity="fatal" if entity.severity == "fatal" else "degraded",
        reason=f"health: {entity.rule}: {entity.reason}",
        owner=OWNER,
    )


class Health:
    def __init__(
        self, ctx: Context, bus: Bus, ledger: Ledger, engine: HealthEngine | None = None,
        kube: "NodeQuarantine | None" = None,
    ) -> None:  # fmt: skip
        self.ctx = ctx
        self.kube = kube
        self.bus = bus
        self.ledger = ledger
        self.engine = engine or HealthEngine()
        self.inventory: dict[str, list[int]] = {}
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        for verdict in await self.bus.read_latest(
            HEALTH, self.bus.names.subject("health.verdicts.>"), Decoder(GpuHealthVerdict)
        ):
            self.engine.restore(verdict)
        await self.bus.watch_latest(self.bus.names.subject("inventory.>"), Decoder(NodeInventory), self._on_inventory)
        await self._last_samples()
        await self.reconcile()
        consumers = [
            self.bus.consumer(
                stream=TELEMETRY, durable="health", filter_subjects=[self.bus.names.subject("telemetry.>")],
                decoder=Decoder(TelemetryWire), handler=self.on_telemetry, remember=TELEMETRY_REMEMBERED,
            ),
            self.bus.consumer(
                stream=HEALTH, durable="health-commands", filter_subjects=[self.bus.names.subject("health.commands.>")],
                decoder=Decoder(HealthCommand), handler=self.on_command, remember=COMMANDS_REMEMBERED,
            ),
        ]  # fmt: skip
        for consumer in consumers:
            await consumer.start()

    async def _last_samples(self) -> None:
        """Every node's last telemetry before this start (the TELEMETRY stream keeps an hour): nodes heard from
        before are watched for silence at once, not only once they report again."""
        now = self.ctx.clock.now()
        latest = await self.bus.read_latest(TELEMETRY, self.bus.names.subject("telemetry.>"), Decoder(TelemetryWire))
        for event in latest:
            batch = as_telemetry(event)
            if isinstance(batch, NodeTelemetry):
                self.engine.heard_before(batch, now)

    def _on_inventory(self, inv: NodeInventory) -> None:
        """The ledger's slots are the devices; the engine counts physical GPUs (MIG reconfiguration changes the
        devices, not the GPUs, and must not look like a lost GPU)."""
        self.inventory[inv.node.name] = [g.index for g in inv.node.gpus]
        gpus, parents = physical_gpus(inv.node.gpus)
        # GPUs its agent could not read at start count as missing (until an operator's release accepts the rest).
        self.engine.set_inventory(inv.node.name, gpus, self.ctx.clock.now(), parents, inv.node.unreadable_gpus)

    async def on_telemetry(self, event: NodeTelemetryColumns | NodeTelemetry | GpuXidEvent) -> None:
        event = as_telemetry(event)
        batch = event if isinstance(event, NodeTelemetry) else as_batch(event)
        async with self._lock:
            await self.apply(self.engine.observe(batch, self.ctx.clock.now()))

    async def on_command(self, cmd: HealthCommand) -> None:
        async with self._lock:
            await self.apply(self.engine.command(cmd, self.ctx.clock.now()))

    async def apply(self, verdicts: list[GpuHealthVerdict]) -> None:
        """Cordons first (the ledger is the truth the scheduler reads), then every verdict, published together."""
        for verdict in verdicts:
            entity = self.engine.entities[(verdict.node, verdict.gpu_index)]
            slots = self._slots(verdict.node, verdict.gpu_index)
            if verdict.state == HealthState.QUARANTINED and not verdict.breaker_open:
                await self.ledger.cordon(slots, cordon_reason(entity))
                if self.kube is not None and verdict.gpu_index is None:
                    self.kube.quarantine(verdict.node, cordon_reason(entity).reason)
            elif verdict.state == HealthState.HEALTHY:
                keep = self._wanted_cordons()
                await self.ledger.uncordon([s for s in slots if s not in keep])
                if self.kube is not None and verdict.gpu_index is None:
                    self.kube.release(verdict.node)
        await asyncio.gather(*(self._publish(v) for v in verdicts))

    async def _publish(self, verdict: GpuHealthVerdict) -> None:
        await self.bus.publish(
            self.bus.names.health_verdict(verdict.node, verdict.gpu_index),
            verdict,
            msg_id=f"{verdict.node}/{verdict.gpu_index}:{verdict.state}:{verdict.observed_at}",
        )
        log.warning("health.verdict", node=verdict.node, gpu=verdict.gpu_index, state=verdict.state,
                    reason=verdict.reason, breaker=verdict.breaker_open)  # fmt: skip

    def _slots(self, node: str, gpu: int | None) -> list[str]:
        if gpu is not None:
            return [f"{node}/{gpu}"]
        return [f"{node}/{i}" for i in self.inventory.get(node, [])]

    def _wanted_cordons(self) -> dict[str, Cordon]:
        """Per slot, the worst cordon of the entities that hold it out (a GPU's own and its node's): a fatal one
        wins (found by review: the first entity's was kept, and a GPU's degraded cordon replaced its node's fatal
        one at the next reconcile, so its jobs were drained with their grace instead of interrupted)."""
        wanted: dict[str, Cordon] = {}
        for entity in self.engine.out_of_service():
            cordon = cordon_reason(entity)
            for slot in self._slots(entity.node, entity.gpu):
                found = wanted.get(slot)
                if found is None or (cordon.fatal and not found.fatal):
                    wanted[slot] = cordon
        return wanted

    async def reconcile(self) -> None:
        """Make the ledger's health-owned cordons exactly what the engine says."""
        wanted = self._wanted_cordons()
        by_reason: dict[Cordon, list[str]] = {}
        for slot, cordon in wanted.items():
            by_reason.setdefault(cordon, []).append(slot)
        for cordon, slots in by_reason.items():
            await self.ledger.cordon(slots, cordon)
        current = await self.ledger.cordons()
        stale = [s for s, c in current.items() if c.owner == OWNER and s not in wanted]
        await self.ledger.uncordon(stale)

    async def run(self, stop: asyncio.Event) -> None:
        last_reconcile = 0.0
        while not stop.is_set():
            await wait_event(stop, TICK_S)
            try:
                async with self._lock:
                    await self.apply(self.engine.tick(self.ctx.clock.now()))
                    now = self.ctx.clock.now()
                    if now - last_reconcile >= RECONCILE_INTERVAL_S:
                        await self.reconcile()
                        last_reconcile = now
            except LedgerUnavailable as exc:
                log.warning("health.ledger_unavailable", error=str(exc))
            except Exception:
                log.exception("health.tick_failed")


def load_rules(path: str) -> tuple[Rule, ...]:
    if not path:
        return DEFAULT_RULES
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or []
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as exc:
        raise RuleError(f"cannot read health rules {path}: {exc}") from exc
    if not isinstance(raw, list):
        raise RuleError(f"health rules {path}: expected a list of rules")
    try:
        return merge_rules(raw)
    except RuleError as exc:
        raise RuleError(f"health rules {path}: {exc}") from exc


async def main(ctx: Context, stop: asyncio.Event) -> None:
    engine = HealthEngine(load_rules(ctx.settings.health_rules_file))
    bus = await ctx.bus()
    ledger = ctx.ledger()
    kube = None
    if ctx.settings.kube_api:
        from chamber.common.kube.client import KubeClient
        from chamber.health.kube_quarantine import NodeQuarantine

        kube = NodeQuarantine(KubeClient.connect(ctx.settings.kube_api))
    health = Health(ctx, bus, ledger, engine, kube)
    try:
        await health.start()
        await health.run(stop)
    finally:
        if kube is not None:
            await kube.close()
        await bus.close()
        await ledger.close()
