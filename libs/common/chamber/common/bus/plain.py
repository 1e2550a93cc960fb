"""A plain connection to a NATS server, for the paths that do without nats-py's work per message
(`DirectAckPipeline`, `OrderedReader`, `PlainPuller`): connect, say CONNECT and subscribe, answer the server's
PINGs, hand each chunk's complete frames to the owner, cut by `FrameParser` (subject, sid, reply subject, header
block, payload), and write what is sent in one turn of the event loop at once (`send`).

Only a single plain `nats://` server is used this way (`direct_supported`): a server that asks for TLS (or does
not do headers) raises `Unsupported`, and the callers keep nats-py for it.
"""

import asyncio
import json
from typing import Any, Protocol, cast

from chamber.common.bus.errors import BusError
from chamber.common.bus.firehose import FrameParser
from chamber.common.log import get_logger

log = get_logger(__name__)

Frame = tuple[bytes, bytes, bytes, bytes, bytes]
"""(subject, sid, reply subject or b"", header block or b"", payload)"""


class Unsupported(BusError):
    """The server needs what this connection does not do (TLS, headers)."""


class FrameOwner(Protocol):
    @property
    def label(self) -> str: ...

    def _take(self, protocol: "PlainProtocol", frames: list[Frame]) -> None: ...

    def _lost(self, protocol: "PlainProtocol", exc: Exception | None) -> None: ...


class PlainProtocol(asyncio.Protocol):
    def __init__(self, owner: FrameOwner) -> None:
        self.owner = owner
        self.parser = FrameParser(full=True)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.info: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.pong: asyncio.Future[None] = loop.create_future()
        self.closed = False
        self.read_at = loop.time()
        """When the server last sent anything."""
        self._outbox: list[bytes] = []
        self._pings_sent = 0
        """PINGs written, counting CONNECT's: the server answers them in order, so the n-th PONG answers the n-th."""
        self._pong_waiters: list[tuple[int, asyncio.Future[bool]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        pings, pongs = parser.pings, parser.pongs
        frames: list[Frame] = []
        parser.feed(data, frames)
        self.read_at = asyncio.get_running_loop().time()
        if frames:
            self.owner._take(self, frames)
        if parser.pings != pings:
            self.write(b"PONG\r\n" * (parser.pings - pings))
        if parser.info is not None and not self.info.done():
            try:
                self.info.set_result(json.loads(parser.info))
            except ValueError as exc:
                self.info.set_exception(ConnectionError(f"unreadable INFO from the server: {exc}"))
        if parser.errors:
            log.warning("nats.plain_error", of=self.owner.label, errors=parser.errors)
            if not self.pong.done():
                self.pong.set_exception(ConnectionError("; ".join(parser.errors)))
            parser.errors.clear()
        if parser.pongs != pongs:
            if not self.pong.done():
                self.pong.set_result(None)
            if self._pong_waiters:
                self._answered(parser.pongs)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for future in (self.info, self.pong):
            if not future.done():
                future.set_exception(ConnectionError(f"connection closed: {exc}"))
        for _, waiter in self._pong_waiters:
            if not waiter.done():
                waiter.set_result(False)
        self._pong_waiters.clear()
        self.owner._lost(self, exc)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def send(self, frames: list[bytes]) -> None:
        """Queue frames, written at once with all others queued in this turn of the event loop (many callers
        publishing a message each, as the gateway's requests do, make one write and one read at the server)."""
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox += frames

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if frames:
            self.write(b"".join(frames))

    async def answers(self, timeout_s: float) -> bool:
        """Whether the server answers a PING within `timeout_s`: a connection whose replies stopped coming though the
        server still reads and answers it is alive (a busy JetStream is late with acks, not the connection); a
        half-open one (the peer gone without a FIN) answers nothing."""
        if self.closed or self.transport is None:
            return False
        self._pings_sent += 1
        self.write(b"PING\r\n")  # (now: ahead of anything `send` queued in this turn of the event loop)
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pong_waiters.append((self._pings_sent, waiter))
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        finally:
            self._pong_waiters = [(n, w) for n, w in self._pong_waiters if w is not waiter]

    def _answered(self, pongs: int) -> None:
        still = []
        for n, waiter in self._pong_waiters:
            if n <= pongs:
                if not waiter.done():
                    waiter.set_result(True)
            else:
                still.append((n, waiter))
        self._pong_waiters = still

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def connect_plain(
    host: str, port: int, options: dict[str, object], owner: FrameOwner, subscribe: bytes
) -> PlainProtocol:
    """A connection whose server has taken CONNECT (`options`) and the `subscribe` frames (a PING answered after
    them): raises `Unsupported` for a server that needs TLS or has no headers."""
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_connection(lambda: PlainProtocol(owner), host, port)
    try:
        info = await protocol.info
        if info.get("tls_required") or not info.get("headers", False):
            raise Unsupported(f"the server at {host}:{port} needs TLS or has no headers")
        protocol._pings_sent += 1
        protocol.write(b"CONNECT %s\r\n%sPING\r\n" % (json.dumps(options).encode(), subscribe))
        await protocol.pong
    except BaseException:
        protocol.close()
        raise
    return protocol
