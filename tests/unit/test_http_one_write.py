"""The gateway's HTTP protocol (`http_protocol.OneWritePerTurn`): a response sent in one go leaves in one write; a
response whose body comes later has its head written at once; nothing written before a close is lost; pipelined
and keep-alive requests are answered in order. Served by a real uvicorn on 127.0.0.1, read with a raw socket."""

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from chamber.gateway.http_protocol import OneWritePerTurn, _TurnWrites


class _Spy:
    """A transport that records its writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra:{name}"


async def test_writes_of_one_turn_leave_in_one_write_and_close_flushes_first() -> None:
    spy = _Spy()
    turn = _TurnWrites(spy, asyncio.get_running_loop())  # type: ignore[arg-type]
    turn.write(b"HTTP/1.1 200 OK\r\n\r\n")
    turn.write(b"body")
    assert spy.writes == []
    await asyncio.sleep(0)
    assert spy.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    turn.write(b"last")
    turn.close()
    assert spy.writes[-1] == b"last"
    assert spy.closed
    assert turn.get_extra_info("peername") == "extra:peername"  # the rest is the transport's


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stream":  # the head now, the body a while later (a stream of events)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await asyncio.sleep(0.5)
        await send({"type": "http.response.body", "body": b"late", "more_body": False})
        return
    body = path.encode()
    headers = [(b"content-length", str(len(body)).encode())]
    if path == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _connection() -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw connection to a real uvicorn serving `_app` with `OneWritePerTurn`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(_app, http=OneWritePerTurn, log_config=None, access_log=False, loop="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers a flag, not an event
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        server.should_exit = True
        await task


async def _read_response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    return head, await reader.readexactly(length)


@pytest.mark.timeout(30)
async def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async with _connection() as (reader, writer):
        writer.write(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await _read_response(reader))[1] == b"/a"
        assert (await _read_response(reader))[1] == b"/b"
        writer.write(b"GET /c HTTP/1.1\r\nhost: x\r\n\r\n")
        head, body = await _read_response(reader)
        assert head.startswith(b"HTTP/1.1 200")
        assert body == b"/c"


@pytest.mark.timeout(30)
async def test_a_response_then_close_arrives_whole() -> None:
    async with _connection() as (reader, writer):
        writer.write(b"GET /close HTTP/1.1\r\nhost: x\r\n\r\n")
        everything = await asyncio.wait_for(reader.read(), 5)  # to the end: the server closed the connection
        assert everything.startswith(b"HTTP/1.1 200")
        assert everything.endswith(b"/close")


@pytest.mark.timeout(30)
async def test_the_head_of_a_late_body_is_written_at_once() -> None:
    async with _connection() as (reader, writer):
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.4)  # before the body (0.5 s later)
        assert head.startswith(b"HTTP/1.1 200")
        rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        assert b"late" in rest
