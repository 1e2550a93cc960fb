"""uvicorn's httptools protocol, writing what a connection sends in one turn of the event loop at once.

uvicorn writes a response's status line and headers when the app sends `http.response.start`, and its body when
the app sends `http.response.body`: two `write` system calls a response, and the client, woken by the first,
reads twice. On a loopback connection each write runs the peer's TCP receive path and wakes it, so under load
(`chamber bench e2e`: every submit is one small response) the second write was a good part of the gateway's
cost of a request. Here a connection's transport keeps what is written in a turn of the loop and writes it once
at the end of that turn: a response sent in one go (every JSON answer) leaves in one write, and one whose body
comes later (a stream of events) has its head written at the end of the turn that started it, so a client sees
it at once, as before.
"""

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _TurnWrites:
    """A transport that joins the writes of one turn of the event loop into one; the rest is the transport's."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()  # what was written before the close goes out first, as it would have
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneWritePerTurn(HttpToolsProtocol):
    """`HttpToolsProtocol` over `_TurnWrites` (pass the class as uvicorn's `http`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transport is not an asyncio.Transport subclass; it has the same methods)
        super().connection_made(_TurnWrites(cast(asyncio.Transport, transport), self.loop))  # type: ignore[arg-type]
