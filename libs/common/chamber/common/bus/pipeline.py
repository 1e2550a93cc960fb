"""Pipelined JetStream publishes: many messages in flight, their acks gathered by one reply subscription.

`js.publish` is a request per message (a fresh inbox token, a future, a `wait_for`); at the scheduler's rate
(several stored messages per job) that bookkeeping, not NATS, was the largest cost of the live path. Here every
message goes out at once with a reply subject under one inbox wildcard, and one callback settles the futures.

Written here rather than taken from nats-py's `publish_async`: in nats-py 2.16 an error reply to an async publish
(a compare-and-set refused, a stream missing) raises inside its reply handler, so the future never completes and
the refusal is lost; this one turns every reply (ack, JetStream error, no-responders status) into a result.
"""

import asyncio
import itertools
from collections.abc import Sequence

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import PubAck

from chamber.common.bus.errors import BusError, PublishError, WrongLastSequence

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a compare-and-set (`Nats-Expected-Last-Subject-Sequence`) refused."""


class _Error(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Reply(msgspec.Struct):
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    domain: str | None = None
    error: _Error | None = None


_decode_reply = msgspec.json.Decoder(_Reply).decode


class AckPipeline:
    """Publishes batches of messages to JetStream over one connection and returns each one's ack or error."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._prefix = ""
        self._counter = itertools.count()
        self._waiting: dict[str, asyncio.Future[PubAck | BusError]] = {}
        self._sub: object | None = None

    async def publish_many(
        self, items: Sequence[tuple[str, bytes, dict[str, str] | None]], *, timeout_s: float = 5.0
    ) -> list[PubAck | BusError]:
        if not items:
            return []
        if self._sub is None:
            self._prefix = f"{self.nc.new_inbox()}."
            self._sub = await self.nc.subscribe(f"{self._prefix}*", cb=self._on_reply)
        loop = asyncio.get_running_loop()
        tokens: list[str] = []
        futures: list[asyncio.Future[PubAck | BusError]] = []
        try:
            for subject, data, headers in items:
                token = str(next(self._counter))
                future: asyncio.Future[PubAck | BusError] = loop.create_future()
                self._waiting[token] = future
                tokens.append(token)
                futures.append(future)
                await self.nc.publish(subject, data, reply=self._prefix + token, headers=headers)
            await asyncio.wait(futures, timeout=timeout_s)
        except nats.errors.Error as exc:
            error = PublishError(f"publish not acknowledged: {exc!r}")
            for future in futures:
                if not future.done():
                    future.set_result(error)
        finally:
            for token in tokens:
                self._waiting.pop(token, None)
        late = PublishError(f"publish not acknowledged within {timeout_s:g} s")
        return [f.result() if f.done() else late for f in futures]

    async def _on_reply(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if future is None or future.done():
            return  # a reply after its batch gave up waiting
        future.set_result(_result(msg))

    async def close(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_result(PublishError("connection closed"))
        self._waiting.clear()


def _result(msg: Msg) -> PubAck | BusError:
    status = (msg.headers or {}).get("Status")
    if status == "503":
        return PublishError("publish refused: no stream stores this subject (no responders)")
    if status:
        return PublishError(f"publish refused: status {status} {(msg.headers or {}).get('Description', '')}")
    try:
        reply = _decode_reply(msg.data)
    except msgspec.DecodeError:
        return PublishError(f"publish refused: unreadable ack {msg.data[:80]!r}")
    if reply.error is not None:
        text = f"publish refused: code={reply.error.code} err_code={reply.error.err_code} {reply.error.description}"
        if reply.error.err_code == WRONG_LAST_SEQUENCE:
            return WrongLastSequence(text)
        return PublishError(text)
    return PubAck(stream=reply.stream, seq=reply.seq, domain=reply.domain, duplicate=reply.duplicate)
