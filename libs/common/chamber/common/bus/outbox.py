"""Publishes that must not be lost while NATS is away: tried a few times, then kept, in order, and published again.

A shell that reports what happened (the Kubernetes executor's job reports, the intake's submits and cancels) cannot
drop a message JetStream did not store: nothing may happen again to bring it back, and a job would then hold its
GPUs, or never be submitted, until a restart. The message id makes a repeat harmless. While some wait, a new one
waits behind them, so a job's events still reach their consumers in the order they happened (a cancel never
before its submit, a stop never before its start).
"""

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chamber.common.bus.errors import BusError
from chamber.common.log import get_logger

if TYPE_CHECKING:
    from chamber.common.bus.client import Bus

log = get_logger(__name__)


class Outbox:
    def __init__(self, bus: "Bus", name: str) -> None:
        self.bus = bus
        self.name = name
        self._waiting: dict[str, tuple[str, Any]] = {}
        """message id -> (subject, value), in the order they were to be published."""

    def __len__(self) -> int:
        return len(self._waiting)

    async def publish(self, subject: str, value: Any, msg_id: str, retry_delays: Sequence[float]) -> None:
        """Publish now, trying again after each of `retry_delays`; if JetStream still does not store it (or others
        wait already), keep it for `flush`."""
        if not self._waiting:
            for delay in (*retry_delays, None):
                if await self._try(subject, value, msg_id):
                    return
                if delay is not None:
                    await asyncio.sleep(delay)
        self._waiting[msg_id] = (subject, value)

    async def flush(self) -> None:
        """Publish what waits, in order, until one is refused (NATS still away: the rest wait for the next call)."""
        for msg_id, (subject, value) in list(self._waiting.items()):
            if not await self._try(subject, value, msg_id):
                return
            del self._waiting[msg_id]

    async def _try(self, subject: str, value: Any, msg_id: str) -> bool:
        try:
            await self.bus.publish(subject, value, msg_id=msg_id)
            return True
        except BusError as exc:
            log.warning(f"{self.name}.publish_failed", subject=subject, error=str(exc), waiting=len(self._waiting))
            return False
