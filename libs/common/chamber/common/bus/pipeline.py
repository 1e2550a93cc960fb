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


class AckBatch:
    """The acks of one `publish_many` call: filled in by the reply callback, one future for the whole batch (a
    future and a timeout per message cost more than the publish itself)."""

    __slots__ = ("done", "left", "results")

    def __init__(self, size: int, done: "asyncio.Future[None]") -> None:
        self.results: list[PubAck | BusError | None] = [None] * size
        self.left = size
        self.done = done

    def settle(self, index: int, result: PubAck | BusError) -> None:
        if self.results[index] is None:
            self.results[index] = result
            self.left -= 1
            if self.left == 0 and not self.done.done():
                self.done.set_result(None)


class AckPipeline:
    """Publishes batches of messages to JetStream over one connection and returns each one's ack or error."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._prefix = ""
        self._counter = itertools.count()
        self._waiting: dict[str, tuple[AckBatch, int]] = {}
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
        batch = AckBatch(len(items), loop.create_future())
        tokens: list[str] = []
        timer = loop.call_later(timeout_s, expire_batch, batch.done)
        try:
            for index, (subject, data, headers) in enumerate(items):
                token = str(next(self._counter))
                self._waiting[token] = (batch, index)
                tokens.append(token)
                await self.nc.publish(subject, data, reply=self._prefix + token, headers=headers)
            await batch.done
        except nats.errors.Error as exc:
            error = PublishError(f"publish not acknowledged: {exc!r}")
            for index in range(len(items)):
                batch.settle(index, error)
        finally:
            timer.cancel()
            for token in tokens:
                self._waiting.pop(token, None)
        late = PublishError(f"publish not acknowledged within {timeout_s:g} s")
        return [late if result is None else result for result in batch.results]

    async def _on_reply(self, msg: Msg) -> None:
        entry = self._waiting.pop(msg.subject[len(self._prefix) :], None)
        if entry is not None:  # None: a reply after its batch gave up waiting
            entry[0].settle(entry[1], _result(msg))

    async def close(self) -> None:
        closed = PublishError("connection closed")
        for batch, index in self._waiting.values():
            batch.settle(index, closed)
        self._waiting.clear()


def expire_batch(done: "asyncio.Future[None]") -> None:
    if not done.done():
        done.set_result(None)


def _result(msg: Msg) -> PubAck | BusError:
    headers = msg.headers or {}
    return reply_result(headers.get("Status", ""), headers.get("Description", ""), msg.data)


def reply_result(status: str, description: str, data: bytes) -> PubAck | BusError:
    """What a reply to a JetStream publish says: its ack, or why the message was not stored (`status` and
    `description` are those of a status the server itself sent: 503, no stream stores the subject)."""
    if status == "503":
        return PublishError("publish refused: no stream stores this subject (no responders)")
    if status:
        return PublishError(f"publish refused: status {status} {description}")
    try:
        reply = _decode_reply(data)
    except msgspec.DecodeError:
        return PublishError(f"publish refused: unreadable ack {data[:80]!r}")
    if reply.error is not None:
        text = f"publish refused: code={reply.error.code} err_code={reply.error.err_code} {reply.error.description}"
        if reply.error.err_code == WRONG_LAST_SEQUENCE:
            return WrongLastSequence(text)
        return PublishError(text)
    return PubAck(stream=reply.stream, seq=reply.seq, domain=reply.domain, duplicate=reply.duplicate)
