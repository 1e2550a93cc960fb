"""`Puller` over a plain connection of its own: a durable consumer's pull requests, deliveries and acks without
nats-py's work per message.

The scheduler consumes three messages a job (the submission and the executor's two reports). Through nats-py each
was parsed by its regex parser into a header dict and a `Msg`, passed through the subscription's pending queue
and task, and acked by a publish of its own through nats-py's flusher. Here the frames are cut by `FrameParser`,
each delivery becomes a `PlainMsg` (its subject, reply subject and payload), and acks, naks and terms are frames
queued and written once per turn of the event loop, with the pull requests.

Requests, statuses, the top-up rule and `fetch` are `Puller`'s (both are `PullRequests`). The connection is made
again, with backoff, when it is lost or when the server answers nothing for a while although requests are open (a
half-open connection); requests open on a lost connection are forgotten at once (the server forgot them), and acks
queued while it was away are written on the next one (an ack is good on any connection). One that does not make
it means a redelivery after the ack wait, which every handler tolerates, as with nats-py.
"""

import asyncio
import contextlib
import secrets
from urllib.parse import urlparse

from chamber.common.bus.errors import BusError
from chamber.common.bus.firehose import connect_options
from chamber.common.bus.plain import Frame, PlainProtocol, connect_plain
from chamber.common.bus.puller import PullRequests
from chamber.common.log import get_logger

log = get_logger(__name__)

CONNECT_TIMEOUT_S = 2.0
RETRY_S = 0.1
MAX_RETRY_S = 2.0
INBOX_SID = b"1"
_ACK, _TERM = b"+ACK", b"+TERM"


class PlainMsg:
    """A delivered message: what the consumer reads of it, and how it settles it (see `nats.aio.msg.Msg`)."""

    __slots__ = ("_puller", "data", "reply", "subject")

    def __init__(self, subject: str, reply: str, data: bytes, puller: "PlainPuller") -> None:
        self.subject = subject
        self.reply = reply
        self.data = data
        self._puller = puller

    async def ack(self) -> None:
        self._puller.settle(self.reply, _ACK)

    async def nak(self, delay: float | None = None) -> None:
        nak = b"-NAK" if delay is None else b'-NAK {"delay": %d}' % int(delay * 1e9)
        self._puller.settle(self.reply, nak)

    async def term(self) -> None:
        self._puller.settle(self.reply, _TERM)


class PlainPuller(PullRequests[PlainMsg]):
    def __init__(
        self, url: str, stream: str, durable: str, *, batch: int, expires_s: float = 2.0, name: str = "chamber"
    ) -> None:
        super().__init__(stream, durable, batch=batch, expires_s=expires_s)
        parsed = urlparse(url.strip())
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 4222
        self._options = connect_options(url.strip(), f"{name}-{durable}")
        self._next = self.subject.encode()
        self._inbox = f"_INBOX.{secrets.token_hex(11)}."
        self._protocol: PlainProtocol | None = None
        self._outbox: list[bytes] = []
        """Acks, naks and terms not written yet (kept while the connection is away)."""
        self._keeper: asyncio.Task[None] | None = None
        self._gone = asyncio.Event()
        self._stopped = False
        """No more deliveries wanted (a connection made again after `stop` only writes what is left to settle)."""
        self._closed = False

    @property
    def label(self) -> str:
        return f"pull {self.subject}"

    async def start(self) -> None:
        """Connect; raises `BusError` (`Unsupported` for a server this cannot read) if that fails."""
        try:
            self._protocol = await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT_S)
        except (OSError, ConnectionError, TimeoutError) as exc:
            raise BusError(f"cannot pull from {self.subject}: {exc}") from exc
        self._keeper = asyncio.create_task(self._keep_connected())

    async def stop(self) -> list[PlainMsg]:
        """Stop receiving; returns the messages delivered and never handed out (the caller gives them back: the
        connection stays for that until `close`)."""
        self._stopped = True
        if self._protocol is not None:
            self._protocol.write(b"UNSUB %s\r\n" % INBOX_SID)
        left = list(self._buffer)
        self._buffer.clear()
        return left

    async def close(self) -> None:
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        self._flush()
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.close()  # (what is written goes out before the connection closes)

    def settle(self, reply: str, what: bytes) -> None:
        if not reply:
            return
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(b"PUB %s %d\r\n%s\r\n" % (reply.encode(), len(what), what))

    def _flush(self) -> None:
        protocol = self._protocol
        if self._outbox and protocol is not None and not protocol.closed:
            frames, self._outbox = self._outbox, []
            protocol.write(b"".join(frames))

    async def _top_up(self) -> None:
        protocol = self._protocol
        if protocol is None or protocol.closed:
            return  # the keeper is making the connection again
        token = self._next_request()
        if token is not None:
            protocol.write(b"PUB %s %s%s %d\r\n%s\r\n" % (
                self._next, self._inbox.encode(), token.encode(), len(self._request), self._request,
            ))  # fmt: skip

    def _take(self, protocol: PlainProtocol, frames: list[Frame]) -> None:
        if protocol is not self._protocol:
            return
        skip = len(self._inbox)
        for subject, sid, reply, header, payload in frames:
            if sid != INBOX_SID:
                continue
            if header[8:9] == b" ":  # `NATS/1.0 <code> <description>`: a status ends a request
                line = header[9 : header.find(b"\r\n")].decode(errors="replace")
                status, _, description = line.partition(" ")
                self._ended(subject[skip:].decode(errors="replace"), status, description.strip())
                continue
            self._delivered(PlainMsg(subject.decode(errors="replace"), reply.decode(), payload, self))
        self._wake_fetch()

    def _lost(self, protocol: PlainProtocol, exc: Exception | None) -> None:
        if protocol is self._protocol:
            self._open.clear()  # the server forgot them with the connection
            self._gone.set()
            if not self._closed:
                log.warning("nats.pull_disconnected", subject=self.subject, error=str(exc))
            self._wake_fetch()

    async def _connect(self) -> PlainProtocol:
        subscribe = b"" if self._stopped else b"SUB %s* %s\r\n" % (self._inbox.encode(), INBOX_SID)
        return await connect_plain(self._host, self._port, self._options, self, subscribe)

    async def _keep_connected(self) -> None:
        """Make the connection again when it is lost, or when the server has sent nothing for three request expiries
        while requests were open (a half-open connection: an open request gets at least a status by its expiry)."""
        delay = RETRY_S
        loop = asyncio.get_running_loop()
        while not self._closed:
            protocol = self._protocol
            if protocol is not None and not protocol.closed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._gone.wait(), self.expires_s)
                self._gone.clear()
                if not protocol.closed and self._open and loop.time() - protocol.read_at > 3 * self.expires_s:
                    log.warning(
                        "nats.pull_silent", subject=self.subject, silent_s=round(loop.time() - protocol.read_at)
                    )
                    protocol.abort()
                continue
            try:
                self._protocol = await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT_S)
            except Exception as exc:  # (never let the keeper end: the consumer would wait on a dead connection)
                log.warning("nats.pull_reconnect_failed", subject=self.subject, error=repr(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_RETRY_S)
                continue
            log.info("nats.pull_reconnected", subject=self.subject)
            delay = RETRY_S
            self._open.clear()
            self._flush()
            self._wake_fetch()
