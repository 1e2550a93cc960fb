"""The audit trail on the AUDIT stream: written once per mutating call, read back newest first.

A record is published after the call's outcome is known, before the answer leaves the gateway, so an admin who
got a 2xx finds the record already there. A record that cannot be stored (NATS down: the call itself then got a
503) is logged as `audit.lost` with its content, so even then it is not silently gone.
"""

import msgspec
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from chamber.common.bus import Bus, PublishError
from chamber.common.bus.errors import BusError
from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import AuditRecord
from chamber.common.log import get_logger
from chamber.common.subjects import AUDIT

log = get_logger(__name__)

SCAN_LIMIT = 10_000
"""A filtered read looks at most at this many of the newest records."""

_decoder = Decoder(AuditRecord)


def resource_of(path: str) -> str:
    """`/v1/jobs/j1/...` -> `jobs`: the subject token records are filed under."""
    parts = [p for p in path.split("/") if p]
    name = parts[1] if len(parts) > 1 and parts[0] == "v1" else (parts[0] if parts else "root")
    return "".join(c for c in name if c.isalnum() or c in "-_") or "other"


class AuditLog:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def record(self, entry: AuditRecord, resource: str) -> None:
        if not self.bus.nc.is_connected:
            log.error("audit.lost", reason="NATS disconnected", **msgspec.structs.asdict(entry))
            return
        try:
            await self.bus.publish(self.bus.names.audit(resource), entry)
        except PublishError as exc:
            log.error("audit.lost", reason=str(exc), **msgspec.structs.asdict(entry))

    async def read(
        self, *, limit: int, actor: str | None = None, since: float | None = None, outcome: str | None = None
    ) -> list[AuditRecord]:
        """The newest `limit` records matching the filters, newest first."""
        js = self.bus.js
        stream = self.bus.names.stream(AUDIT)
        try:
            info = await js.stream_info(stream)
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the audit stream: {exc}") from exc
        last, first = info.state.last_seq, info.state.first_seq
        if info.state.messages == 0:
            return []
        scan = limit if actor is None and outcome is None and since is None else SCAN_LIMIT
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=max(first, last - scan + 1), ack_policy=AckPolicy.NONE,
                                inactive_threshold=30.0)  # fmt: skip
        out: list[AuditRecord] = []
        try:
            psub = await js.pull_subscribe(self.bus.names.subject("audit.>"), stream=stream, config=config)
            try:
                pending = (await psub.consumer_info()).num_pending or 0
                while pending > 0:
                    msgs = await psub.fetch(min(pending, 1024), timeout=2.0)
                    pending -= len(msgs)
                    for msg in msgs:
                        try:
                            rec: AuditRecord = _decoder.decode(msg.data)
                        except DecodeError:
                            continue
                        if (
                            (actor is None or rec.actor == actor)
                            and (outcome is None or rec.outcome == outcome)
                            and (since is None or rec.at >= since)
                        ):
                            out.append(rec)
            finally:
                await psub.unsubscribe()
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusError(f"cannot read the audit stream: {exc}") from exc
        out.reverse()
        return out[:limit]
