"""A core-NATS subscription for one high-rate subject, read in bulk: payloads in lists, no object per message.

nats-py turns every message into a `Msg` through a regex parser, a pending queue and a callback: about 25 us of
CPU a message, so 12,500 nodes reporting 8 GPUs each cost most of a core before a byte is decoded. The fleet
metrics aggregator needs only the payloads, many at a time. `Firehose` keeps its own plain connection to the
server, reads whatever the socket holds, cuts complete `MSG`/`HMSG` frames into a list of payload bytes (about
1 us a frame) and hands that list to a handler in slices of at most `slice_msgs`, yielding to the event loop
between slices, so a timer (the aggregator's tick) is never held up by more than one slice.

It reads the socket as fast as data arrives and keeps what the handler has not taken yet, up to
`pending_bytes_limit`; beyond that it drops new messages and counts them (`dropped`), as nats-py does for a slow
subscription, rather than letting the server cut the connection. A lost connection is re-established with backoff;
core NATS does not replay what was sent meanwhile (telemetry is a rolling view: the next sample replaces it).

Only plain `nats://` connections are read this way (with user/password or token from the URL);
`supported(url)` says whether one is, and callers keep the nats-py subscription for anything else (TLS).
"""

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import unquote, urlparse

from chamber.common.log import get_logger

log = get_logger(__name__)

BatchHandler = Callable[[list[bytes]], Awaitable[None] | None]
SID = b"1"
RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024
"""The socket's receive buffer, where the system allows that much: the server then writes a burst of 12,500 node
batches in few large writes instead of stalling its publishers while the handler is busy (measured: ~8% more samples
a second on one core in `chamber bench telemetry`)."""


def supported(url: str) -> bool:
    """Whether `Firehose` can read from this server URL (a single plain `nats://` server)."""
    parsed = urlparse(url.split(",", maxsplit=1)[0].strip())
    return parsed.scheme in ("nats", "") and bool(parsed.hostname)


def _enlarge_receive_buffer(sock: socket.socket | None) -> None:
    """Set `RECEIVE_BUFFER_BYTES` only where the system's cap allows it: a fixed buffer turns off the kernel's own
    sizing, so a smaller cap (Linux's default `rmem_max` is 208 KiB) would make it worse, not better."""
    try:
        with open("/proc/sys/net/core/rmem_max") as limit:
            cap = int(limit.read())
    except (OSError, ValueError):
        return
    if sock is not None and cap >= RECEIVE_BUFFER_BYTES:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)


class FrameParser:
    """Cuts NATS server-to-client protocol into frames; answers nothing itself (it counts PINGs and PONGs, keeps
    the server's last INFO and its errors). By default each MSG/HMSG frame is its payload; with `full`, it is
    (subject, sid, reply subject or b"", header block, payload): what the plain connections need
    (`chamber.common.bus.plain`) to tell a subscription's messages apart, match an ack to its publish and read a
    delivery's sequences."""

    def __init__(self, *, full: bool = False) -> None:
        self._rest = b""
        self._full = full
        self.pings = 0
        self.pongs = 0
        self.info: bytes | None = None
        """The JSON of the last INFO the server sent."""
        self.errors: list[str] = []

    def feed(self, data: bytes, out: list[Any]) -> None:
        """Append every complete MSG/HMSG frame in what came so far to `out`; keep the rest."""
        if self._rest:
            data = self._rest + data
        pos, end_of_data = 0, len(data)
        find, full = data.find, self._full
        while True:
            eol = find(b"\r\n", pos)
            if eol < 0:
                break
            op = data[pos : pos + 4]
            if op == b"MSG ":  # MSG <subject> <sid> [reply] <size>
                size = int(data[data.rfind(b" ", pos, eol) + 1 : eol])
                start = eol + 2
                if start + size + 2 > end_of_data:
                    break
                payload = data[start : start + size]
                if full:
                    args = data[pos + 4 : eol].split(b" ")
                    out.append((args[0], args[1], args[2] if len(args) == 4 else b"", b"", payload))
                else:
                    out.append(payload)
                pos = start + size + 2
            elif op == b"HMSG":  # HMSG <subject> <sid> [reply] <header size> <total size>
                args = data[pos + 5 : eol].split(b" ")
                header, total = int(args[-2]), int(args[-1])
                start = eol + 2
                if start + total + 2 > end_of_data:
                    break
                payload = data[start + header : start + total]
                if full:
                    reply = args[2] if len(args) == 5 else b""
                    out.append((args[0], args[1], reply, data[start : start + header], payload))
                else:
                    out.append(payload)
                pos = start + total + 2
            else:
                if op == b"PING":
                    self.pings += 1
                elif op == b"PONG":
                    self.pongs += 1
                elif op == b"INFO":
                    self.info = data[pos + 5 : eol]
                elif op == b"-ERR":
                    self.errors.append(data[pos + 5 : eol].decode(errors="replace"))
                pos = eol + 2  # +OK
        self._rest = data[pos:] if pos < end_of_data else b""


def connect_options(url: str, name: str, **extra: object) -> dict[str, object]:
    """The CONNECT options of a plain connection to the server of `url` (user and password, or a token, from it)."""
    parsed = urlparse(url)
    options: dict[str, object] = {"verbose": False, "pedantic": False, "name": name, "lang": "python",
                                  "protocol": 1, "headers": True, **extra}  # fmt: skip
    if parsed.username and parsed.password is not None:
        options["user"], options["pass"] = unquote(parsed.username), unquote(parsed.password)
    elif parsed.username:
        options["auth_token"] = unquote(parsed.username)
    return options


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: "Firehose") -> None:
        self.owner = owner
        self.parser = FrameParser()
        self.transport: asyncio.Transport | None = None
        self.pong: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        pings = parser.pings
        self.owner._take(data, parser)
        if parser.pings != pings and self.transport is not None:
            self.transport.write(b"PONG\r\n" * (parser.pings - pings))
        if parser.errors:
            log.warning("nats.firehose_error", errors=parser.errors)
            parser.errors.clear()
        if not self.pong.done() and parser.pongs:
            self.pong.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)
        if not self.pong.done():
            self.pong.set_exception(ConnectionError(f"connection closed: {exc}"))


class Firehose:
    def __init__(
        self,
        url: str,
        subject: str,
        handler: BatchHandler,
        *,
        name: str = "chamber-firehose",
        slice_msgs: int = 2_000,
        pending_bytes_limit: int = 1024 * 1024 * 1024,
        ping_interval_s: float = 60.0,
    ) -> None:
        self.url = url.split(",", maxsplit=1)[0].strip()
        self.subject = subject
        self.handler = handler
        self.name = name
        self.slice_msgs = slice_msgs
        self.pending_bytes_limit = pending_bytes_limit
        self.ping_interval_s = ping_interval_s
        self.received = 0
        self.dropped = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._protocol: _Protocol | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def _take(self, data: bytes, parser: FrameParser) -> None:
        if self._pending_bytes > self.pending_bytes_limit:
            out: list[bytes] = []
            parser.feed(data, out)
            self.dropped += len(out)
            return
        before = len(self._pending)
        parser.feed(data, self._pending)
        self._pending_bytes += len(data)
        if len(self._pending) != before:
            self.received += len(self._pending) - before
            self._wake.set()

    async def start(self, timeout_s: float = 10.0) -> None:
        """Connect and subscribe; returns once the server has the subscription (a PING answered after SUB)."""
        await asyncio.wait_for(self._connect(), timeout_s)
        self._tasks = [asyncio.create_task(self._deliver()), asyncio.create_task(self._keep_connected())]

    async def _connect(self) -> None:
        parsed = urlparse(self.url)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(
            lambda: _Protocol(self), parsed.hostname or "127.0.0.1", parsed.port or 4222
        )
        options = connect_options(self.url, self.name)
        protocol.transport = transport
        _enlarge_receive_buffer(transport.get_extra_info("socket"))
        transport.write(
            b"CONNECT %s\r\nSUB %s %s\r\nPING\r\n" % (json.dumps(options).encode(), self.subject.encode(), SID)
        )
        try:
            await protocol.pong
        except BaseException:
            transport.close()
            raise
        self._protocol = protocol

    async def _keep_connected(self) -> None:
        delay = 0.1
        while not self._closed:
            protocol = self._protocol
            if protocol is not None:
                exc = await self._until_lost(protocol)  # close() cancels this task first
                log.warning("nats.firehose_disconnected", subject=self.subject, error=str(exc))
                self._protocol = None
            try:
                await asyncio.wait_for(self._connect(), 5.0)
                log.info("nats.firehose_reconnected", subject=self.subject)
                delay = 0.1
            except (OSError, ConnectionError, TimeoutError) as exc:
                log.warning("nats.firehose_reconnect_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)

    async def _until_lost(self, protocol: _Protocol) -> Exception | None:
        """Wait for the connection to end; PING the server every `ping_interval_s` and cut a connection that has not
        answered the previous PING (a half-open TCP connection would otherwise look like a quiet subject forever)."""
        expected = protocol.parser.pongs
        while True:
            done, _ = await asyncio.wait([protocol.lost], timeout=self.ping_interval_s)
            if done:
                return protocol.lost.result()
            assert protocol.transport is not None
            if protocol.parser.pongs < expected:
                protocol.transport.abort()
                return await protocol.lost
            protocol.transport.write(b"PING\r\n")
            expected += 1

    async def _deliver(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending, self._pending_bytes = self._pending, [], 0
            step = self.slice_msgs
            for i in range(0, len(batch), step):
                try:
                    done = self.handler(batch[i : i + step] if len(batch) > step else batch)
                    if done is not None:
                        await done
                except Exception:
                    log.exception("nats.firehose_handler_failed", subject=self.subject)
                await asyncio.sleep(0)

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
