"""JetStream publishes over a plain connection of their own: frames written in one go, acks read in bulk.

Through nats-py a publish that waits for its ack cost ~17 us of CPU (the publish call, then the ack through its
regex parser, a `Msg`, a pending queue and a callback task), against ~5 us written and read here (measured: 40,000
600-byte messages in batches of 100). The scheduler publishes about nine such messages a job (records, their
announcements, the executor's reports): its CPU a job in `chamber bench e2e` fell 12-20% with this path.
`DirectAckPipeline` keeps one connection to the server for publishes only: a batch is cut into `PUB`/`HPUB` frames
with a reply subject under this connection's inbox, written with every other frame queued in the same turn of the
event loop; the replies (acks, JetStream errors, the server's no-responders status, which it sends only to a
subscription of the publishing connection) are cut from the socket by `Firehose`'s `FrameParser`, and settle the
batch's results as `AckPipeline`'s do.

Messages of one `Bus` stay in order (one connection), and every publish is awaited to its ack, so nothing else
on the nats-py connection can overtake it. Only a single plain `nats://` server is used this way (user and
password, or a token, from the URL); `direct_supported(url)` says whether, and `Bus` keeps nats-py's path
(`AckPipeline`) for anything else, and for a server that asks for TLS. While the server is away a batch waits for
it to come back within its timeout, as nats-py buffers publishes while it reconnects; a connection lost with
acks outstanding fails them at once (the server forgets a subscription with its connection: they would never
come), and one that let a batch time out is replaced if it does not answer a PING either (it is half-open).
"""

import asyncio
import itertools
import re
import secrets
from collections.abc import Sequence
from urllib.parse import urlparse

from nats.js.api import PubAck

from chamber.common.bus.errors import BusError, PublishError
from chamber.common.bus.firehose import connect_options
from chamber.common.bus.pipeline import AckBatch, AckPipeline, expire_batch, reply_result
from chamber.common.bus.plain import Frame, PlainProtocol, Unsupported, connect_plain
from chamber.common.log import get_logger

log = get_logger(__name__)

CONNECT_TIMEOUT_S = 2.0
RETRY_S = 0.25
"""How long a batch waits between tries to reach a server that is away (within its own timeout)."""
PROBE_S = 2.0
"""How long a connection that let a batch's acks be late has to answer a PING before it is given up."""
_UNSAFE = re.compile(r"[\s]")
"""Whitespace in a subject or a header would break the protocol's framing: such a message is refused here."""


_NAMES: dict[str, bytes] = {}
"""Header names found valid, each as `Name: ` (a service uses a handful: message ids, expected sequences)."""


def _header_block(headers: dict[str, str]) -> bytes | None:
    """The `NATS/1.0` block of `headers`; None when a name or a value would break the protocol's framing."""
    parts = [b"NATS/1.0\r\n"]
    for name, value in headers.items():
        head = _NAMES.get(name)
        if head is None:
            if not name or ":" in name or _UNSAFE.search(name):
                return None
            head = name.encode() + b": "
            if len(_NAMES) < 1024:
                _NAMES[name] = head
        if "\r" in value or "\n" in value:
            return None
        parts.append(head + value.encode() + b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def direct_supported(url: str) -> bool:
    """Whether `DirectAckPipeline` can publish to this server URL: a single plain `nats://` server."""
    if "," in url:
        return False
    parsed = urlparse(url.strip())
    return parsed.scheme in ("nats", "") and bool(parsed.hostname)


class DirectAckPipeline:
    """Publishes batches of messages to JetStream over a connection of its own and returns each one's ack or error,
    as `AckPipeline` does; `fallback` takes over for good if the server needs what this connection does not do."""

    def __init__(self, url: str, fallback: AckPipeline, *, name: str = "chamber") -> None:
        parsed = urlparse(url.strip())
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 4222
        self._options = connect_options(url.strip(), f"{name}-publish", no_responders=True)
        self.fallback = fallback
        self._unsupported = False
        self._protocol: PlainProtocol | None = None
        self._prefix = b""
        self._max_payload = 1024 * 1024
        self._counter = itertools.count()
        self._waiting: dict[bytes, tuple[AckBatch, int]] = {}
        self._lock = asyncio.Lock()
        self._closed = False
        self.probe_s = PROBE_S
        self._probe: tuple[PlainProtocol, asyncio.Future[bool]] | None = None
        """Whether a connection answers a PING (`_keep_if_alive`), while that is being found out."""

    async def publish_many(
        self, items: Sequence[tuple[str, bytes, dict[str, str] | None]], *, timeout_s: float = 5.0
    ) -> list[PubAck | BusError]:
        if not items:
            return []
        if self._unsupported:
            return await self.fallback.publish_many(items, timeout_s=timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._probe is not None and not self._probe[1].done():  # not into a connection that may be half-open
            await asyncio.wait({self._probe[1]}, timeout=max(0.0, deadline - loop.time()))
        try:
            protocol = await self._connected(deadline)
        except Unsupported:
            return await self.fallback.publish_many(items, timeout_s=timeout_s)
        except (OSError, ConnectionError, TimeoutError) as exc:
            error = PublishError(f"publish not acknowledged: NATS unreachable within {timeout_s:g} s: {exc}")
            return [error] * len(items)
        batch = AckBatch(len(items), loop.create_future())
        frames: list[bytes] = []
        tokens: list[bytes] = []
        prefix, waiting, counter, limit = self._prefix, self._waiting, self._counter, self._max_payload
        for index, (subject, data, headers) in enumerate(items):
            if not subject or _UNSAFE.search(subject):
                batch.settle(index, PublishError(f"publish refused: invalid subject {subject!r}"))
                continue
            block = _header_block(headers) if headers else b""
            if block is None:
                batch.settle(index, PublishError(f"publish refused: invalid headers {headers!r}"))
                continue
            if len(block) + len(data) > limit:
                batch.settle(index, PublishError(f"publish refused: {len(data)} bytes, the server takes {limit}"))
                continue
            token = b"%d" % next(counter)
            waiting[token] = (batch, index)
            tokens.append(token)
            if block:
                frames.append(b"HPUB %s %s%s %d %d\r\n%s%s\r\n" % (
                    subject.encode(), prefix, token, len(block), len(block) + len(data), block, data,
                ))  # fmt: skip
            else:
                frames.append(b"PUB %s %s%s %d\r\n%s\r\n" % (subject.encode(), prefix, token, len(data), data))
        timer = loop.call_later(max(0.0, deadline - loop.time()), expire_batch, batch.done)
        try:
            if frames:
                protocol.send(frames)
            await batch.done
        finally:
            timer.cancel()
            for token in tokens:
                waiting.pop(token, None)
        if batch.left:  # some acks did not come in time: the connection may be half-open
            log.warning("nats.direct_acks_late", missing=batch.left, timeout_s=timeout_s)
            await self._keep_if_alive(protocol)
        late = PublishError(f"publish not acknowledged within {timeout_s:g} s")
        return [late if result is None else result for result in batch.results]

    @property
    def label(self) -> str:
        return "direct publishes"

    def _take(self, protocol: PlainProtocol, frames: list[Frame]) -> None:
        on_reply = self._on_reply
        for subject, _, _, header, payload in frames:
            on_reply(subject, header, payload)

    def _on_reply(self, subject: bytes, header: bytes, payload: bytes) -> None:
        entry = self._waiting.pop(subject[len(self._prefix) :], None)
        if entry is None:
            return  # a reply after its batch gave up waiting
        status = description = ""
        if header and header[8:9] == b" ":  # `NATS/1.0 503 <description>\r\n...`: a status from the server
            first = header[9 : header.find(b"\r\n")].decode(errors="replace")
            status, _, description = first.partition(" ")
        entry[0].settle(entry[1], reply_result(status, description, payload))

    def _lost(self, protocol: PlainProtocol, exc: Exception | None) -> None:
        """The connection went (or was given up): the acks it still owes fail now; the next batch connects anew."""
        if protocol is not self._protocol:
            return  # given up already
        self._protocol = None
        protocol.closed = True
        if self._waiting:
            log.warning("nats.direct_disconnected", outstanding=len(self._waiting), error=str(exc))
            lost = PublishError(f"publish not acknowledged: connection lost ({exc})")
            for batch, index in self._waiting.values():
                batch.settle(index, lost)
            self._waiting.clear()

    async def _keep_if_alive(self, protocol: PlainProtocol) -> None:
        """After a batch's acks were late: keep the connection if the server still answers a PING on it (JetStream
        was slow, or this batch's timeout short: other batches waiting on the connection get their acks), give it up
        if not (half-open: nothing more would come on it, so the acks it owes fail at once and the next batch
        connects anew). Giving it up on every late batch failed every other batch waiting on it, their
        publishes most likely stored. Batches late together share one probe, and a batch that comes meanwhile waits
        for its answer before it is written (not into a connection that may be half-open)."""
        if protocol is not self._protocol or protocol.closed:
            return  # given up already
        if self._probe is None or self._probe[0] is not protocol or self._probe[1].done():
            self._probe = (protocol, asyncio.ensure_future(self._answers(protocol)))
        if not await asyncio.shield(self._probe[1]):
            self._drop(protocol)

    async def _answers(self, protocol: PlainProtocol) -> bool:
        answers = await protocol.answers(self.probe_s)
        log.info("nats.direct_connection_probed", answers=answers)
        return answers

    def _drop(self, protocol: PlainProtocol) -> None:
        self._lost(protocol, TimeoutError("acks late"))
        protocol.close()

    async def _connected(self, deadline: float) -> PlainProtocol:
        """This pipeline's connection, made (again) if there is none, trying until `deadline`."""
        protocol = self._protocol
        if protocol is not None and not protocol.closed:
            return protocol
        loop = asyncio.get_running_loop()
        async with self._lock:
            while True:
                protocol = self._protocol
                if protocol is not None and not protocol.closed:
                    return protocol
                if self._closed:
                    raise ConnectionError("the bus is closed")
                left = deadline - loop.time()
                try:
                    self._protocol = await asyncio.wait_for(self._connect(), min(CONNECT_TIMEOUT_S, max(left, 0.01)))
                    return self._protocol
                except (OSError, ConnectionError, TimeoutError):
                    if deadline - loop.time() <= RETRY_S:
                        raise
                await asyncio.sleep(RETRY_S)

    async def _connect(self) -> PlainProtocol:
        prefix = f"_INBOX.{secrets.token_hex(11)}.".encode()
        try:  # (the server has the subscription before any publish waits on it)
            protocol = await connect_plain(self._host, self._port, self._options, self, b"SUB %s* 1\r\n" % prefix)
        except Unsupported:
            self._unsupported = True
            log.info("nats.direct_unsupported", host=self._host)
            raise
        self._max_payload = int(protocol.info.result().get("max_payload", self._max_payload))
        self._prefix = prefix
        return protocol

    async def close(self) -> None:
        self._closed = True
        if self._probe is not None:
            self._probe[1].cancel()
        protocol, self._protocol = self._protocol, None
        closed = PublishError("connection closed")
        for batch, index in self._waiting.values():
            batch.settle(index, closed)
        self._waiting.clear()
        if protocol is not None:
            protocol.close()
        await self.fallback.close()
