"""Following keys of a JetStream KV bucket with an ordered consumer of our own, not nats-py's KV watcher.

nats-py's watcher gives its ordered consumer the default idle heartbeat (5 s) and offers no way to change it. A
NATS restart loses every ordered consumer (the server keeps them in memory), and nats-py recreates one only after
two heartbeats in a row are missed: a watcher heard nothing of the writes made after a restart for ~15 s, so a
gateway kept accepting a token revoked in that time, and the scheduler and quota service kept an old quota
configuration. This follow has the heartbeat every other ordered consumer has (`ORDERED_HEARTBEAT_S`), hands
each entry to the callback on the subscription itself (no second queue and task), and tells when it has handed
over every entry that was current when it started (`KvFollow.loaded`).
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.kv import KV_OP

from chamber.common.bus.client import ORDERED_HEARTBEAT_S
from chamber.common.bus.errors import BusError
from chamber.common.log import get_logger

log = get_logger(__name__)

MARKER_REASON = "Nats-Marker-Reason"
"""The header of an entry the server itself placed when a key expired or was removed (nats-server 2.11+)."""
REMOVING_MARKERS = frozenset({"MaxAge", "Purge", "Remove"})


@dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes | None
    """None where the write removed the key (a delete, a purge, or a marker the server placed at expiry)."""
    revision: int


class KvFollow:
    """A running follow: `loaded` is set once every entry current at its start was handed over; `stop` ends it."""

    def __init__(self) -> None:
        self.loaded = asyncio.Event()
        self._sub: Subscription | None = None

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None


async def follow_kv(
    js: JetStreamContext, bucket: str, keys: str, on_entry: Callable[[KvEntry], Awaitable[None] | None]
) -> KvFollow:
    """Call `on_entry` with the current entry of every key of `bucket` (its full name) matching `keys` (a subject
    pattern: `>` for all), then with every later write, in order. A callback that raises is logged; the follow
    goes on."""
    prefix = f"$KV.{bucket}."
    follow = KvFollow()

    async def on_msg(msg: Msg) -> None:
        try:
            headers = msg.headers
            value: bytes | None = msg.data
            if headers and KV_OP in headers:
                value = None  # a delete or a purge (a put carries no KV-Operation)
            elif headers and MARKER_REASON in headers:
                if headers[MARKER_REASON] not in REMOVING_MARKERS:
                    return  # a marker of a kind this version does not know: nothing to apply
                value = None
            result = on_entry(KvEntry(msg.subject[len(prefix) :], value, msg.metadata.sequence.stream))
            if result is not None:
                await result
        except Exception as exc:  # one bad entry never ends the follow
            log.error("kv.follow_failed", subject=msg.subject, error=repr(exc))
        finally:
            if msg.metadata.num_pending == 0:
                follow.loaded.set()

    try:
        sub = await js.subscribe(
            prefix + keys, stream=f"KV_{bucket}", cb=on_msg, ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, idle_heartbeat=ORDERED_HEARTBEAT_S,
            pending_msgs_limit=0, pending_bytes_limit=0,
        )  # fmt: skip
        # The server's default inactive threshold (5 s), as `Bus.watch_latest`: while the server is down nats-py
        # asks for a new consumer every two missed heartbeats, and at the reconnect each of those requests made
        # one; with nats-py's watcher's 300 s, the ones nobody listens to stayed that long (found by review).
        follow._sub = sub
        info = await sub.consumer_info()
    except nats.errors.Error as exc:
        await follow.stop()
        raise BusError(f"cannot follow {bucket}: {exc}") from exc
    if info.num_pending == 0 and not (info.delivered and info.delivered.consumer_seq):
        follow.loaded.set()  # nothing to hand over (else the last entry handed over says so)
    return follow
