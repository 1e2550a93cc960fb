"""Pull requests for a durable consumer, with the next batch asked for while this one is handled.

nats-py's `fetch` waits for every message with `next_msg`, which creates two tasks and a UUID per message, and
asks for nothing until the caller fetches again, so a consumer alternates between waiting for the server and
working. Here one callback subscription on an inbox receives every delivery into a buffer, and a new pull request
goes out as soon as less than half a batch is in hand or on its way: at load the next batch arrives while this one is
handled, and handing a batch over costs one buffer slice.

Nothing changes for acknowledgements: a delivered message is acked by its handler after its effect, as before.
Messages still buffered when the puller stops are handed back (`stop` returns them; the consumer naks them), so
another instance of the consumer gets them within seconds: left unacked, they waited the whole ack wait (a deposed
scheduler that woke kept a job's finish for 30 s while the new leader ran). One delivered after the unsubscribe
(the open pull requests cannot be cancelled) is redelivered after the ack wait, or replayed at the next start.

Status replies end a request: 408 (it expired), 404 (nothing to deliver), 409 (refused: the consumer was deleted,
too many waiting requests...). A request whose status never comes (the connection dropped) is forgotten after its
expiry, and at once after a reconnect, so the consumer never waits for credit the server no longer holds.
"""

import asyncio
import itertools
import json
from collections import deque
from typing import Generic, Protocol, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg

from chamber.common.bus.errors import BusError

JS_API = "$JS.API"
STATUS = "Status"
DESCRIPTION = "Description"
BENIGN = frozenset({"404", "408", "100"})
"""Statuses that only end a request (or, 100, say the server is alive)."""


class Delivered(Protocol):
    """A delivered message as a consumer reads and settles it: nats-py's `Msg`, or `PlainMsg`."""

    subject: str
    reply: str
    data: bytes

    async def ack(self) -> None: ...

    async def nak(self, delay: float | None = None) -> None: ...

    async def term(self) -> None: ...


M = TypeVar("M")


class PullRequests(Generic[M]):
    """What both pullers keep alike: the messages delivered and not handed out yet, the open pull requests and what
    each still owes, and `fetch`. A puller sends each request `_next_request` asks for (`_top_up`), and reports
    each delivery (`_delivered`) and each status that ends a request (`_ended`)."""

    def __init__(self, stream: str, durable: str, *, batch: int, expires_s: float) -> None:
        self.subject = f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.batch = batch
        self.expires_s = expires_s
        self._request = json.dumps({"batch": batch, "expires": int(expires_s * 1e9)}).encode()
        self._counter = itertools.count()
        self._buffer: deque[M] = deque()
        self._open: dict[str, list[float]] = {}
        """Open requests, oldest first (the server serves them in that order): token -> [still owed, forget at]."""
        self._waiter: asyncio.Future[None] | None = None
        self._refused: str | None = None

    async def fetch(self, timeout_s: float) -> list[M]:
        """Up to one batch of delivered messages, in stream order; [] when none came within `timeout_s`. Raises
        BusError when the server refused the requests (409) and nothing was delivered."""
        if not self._buffer:
            await self._top_up()
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        if not self._buffer:
            refused, self._refused = self._refused, None
            if refused is not None:
                raise BusError(f"pull request on {self.subject} refused: {refused}")
            return []
        buffer = self._buffer
        out = [buffer.popleft() for _ in range(min(len(buffer), self.batch))]
        await self._top_up()
        return out

    async def _top_up(self) -> None:
        raise NotImplementedError

    def _next_request(self) -> str | None:
        """The token of a request to send now, counted as open, once less than half of a batch is in hand or on its
        way (so at most a few requests are open, well under the server's limit of waiting requests per consumer);
        None otherwise. Requests past their expiry are forgotten first (their status may never come)."""
        now = asyncio.get_running_loop().time()
        for token in [t for t, (_, forget_at) in self._open.items() if forget_at <= now]:
            del self._open[token]
        owed = sum(int(owed) for owed, _ in self._open.values())
        if len(self._buffer) + owed > self.batch // 2:
            return None
        token = str(next(self._counter))
        self._open[token] = [float(self.batch), now + self.expires_s + 1.0]
        return token

    def _delivered(self, msg: M) -> None:
        self._buffer.append(msg)
        oldest = next(iter(self._open), None)
        if oldest is not None:
            slot = self._open[oldest]
            slot[0] -= 1
            if slot[0] <= 0:
                del self._open[oldest]

    def _ended(self, token: str, status: str, description: str) -> None:
        """A status ended request `token`: 408 (it expired), 404 (nothing to deliver) and 100 only end it; any
        other (409: the consumer was deleted, too many waiting requests...) is what `fetch` raises."""
        self._open.pop(token, None)
        if status not in BENIGN:
            self._refused = f"{status} {description}".strip()

    def _wake_fetch(self) -> None:
        if self._waiter is not None:
            _wake(self._waiter)


class Puller(PullRequests[Msg]):
    def __init__(self, nc: Client, stream: str, durable: str, *, batch: int, expires_s: float = 2.0) -> None:
        super().__init__(stream, durable, batch=batch, expires_s=expires_s)
        self.nc = nc
        self._prefix = ""
        self._reconnects = 0
        self._sub: object | None = None

    async def start(self) -> None:
        self._prefix = f"{self.nc.new_inbox()}."
        self._sub = await self.nc.subscribe(f"{self._prefix}*", cb=self._on_msg)

    async def stop(self) -> list[Msg]:
        """Stop receiving; returns the messages delivered and never handed out (the caller gives them back)."""
        unsubscribe = getattr(self._sub, "unsubscribe", None)
        self._sub = None
        if unsubscribe is not None:
            await unsubscribe()
        left = list(self._buffer)
        self._buffer.clear()
        return left

    async def close(self) -> None:
        """Nothing of its own to close (the bus's connection stays)."""

    async def _top_up(self) -> None:
        reconnects = self.nc.stats.get("reconnects", 0)
        if reconnects != self._reconnects:  # requests made before a reconnect died with the connection
            self._reconnects = reconnects
            self._open.clear()
        token = self._next_request()
        if token is not None:
            await self.nc.publish(self.subject, self._request, reply=self._prefix + token)

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get(STATUS) if headers else None
        if status is not None:
            self._ended(msg.subject[len(self._prefix) :], status, (headers or {}).get(DESCRIPTION, ""))
        else:
            self._delivered(msg)
        self._wake_fetch()


def _wake(waiter: "asyncio.Future[None]") -> None:
    if not waiter.done():
        waiter.set_result(None)
