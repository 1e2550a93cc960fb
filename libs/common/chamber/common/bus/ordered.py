"""An ordered JetStream consumer read over a plain connection of its own: following a stream without nats-py's
work per message.

The gateway, the quota service and the collector each follow every write of every job record (three a job).
Through nats-py each delivery passed its regex parser, a header dict, a `Msg`, the ordered consumer's checks, a
pending queue and a callback task, and the quota service then parsed the reply subject once more for the stream
sequence (`Msg.metadata`). `OrderedReader` keeps one plain connection, cuts the frames with `FrameParser` and hands
each message to a plain callback where it is read (subject, header block, payload, stream sequence): no object,
queue or task per message.

It is an ordered consumer as the NATS clients define one: an ephemeral push consumer without acks, kept in the
server's memory, with flow control and an idle heartbeat, made anew from the stream sequence after the last
message handed over whenever something went wrong:
- a delivery whose consumer sequence is not the next one (a message was lost), or a heartbeat saying the consumer
  sent more than was read;
- two heartbeats missed in a row (the server lost the consumer: it restarted);
- a status saying the server deleted the consumer;
- the connection lost (it is made again, with backoff).
The consumer given up is deleted at once, and a consumer whose connection went away is removed by the server
after `inactive_s` (nats-py's follows kept theirs for 300 s after a NATS outage: every reconnect made a new one
and the old ones pushed to nobody). Flow-control requests are answered as they are read (every message before
them has been handed over by then), as are heartbeats that say the consumer stalled on one.

Only a single plain `nats://` server is read this way (`direct_supported`); a server that asks for TLS raises
`Unsupported` at `start`, and callers keep nats-py's ordered consumer for those.
"""

import asyncio
import contextlib
import itertools
import json
import secrets
from collections.abc import Callable
from urllib.parse import urlparse

from chamber.common.bus.errors import BusError
from chamber.common.bus.firehose import connect_options
from chamber.common.bus.plain import Frame, PlainProtocol, Unsupported, connect_plain
from chamber.common.log import get_logger

log = get_logger(__name__)

MessageHandler = Callable[[bytes, bytes, bytes, int], None]
"""(subject, header block (b"" when none), payload, stream sequence), called in stream order; it must not block."""
CONNECT_TIMEOUT_S = 2.0
API_TIMEOUT_S = 5.0
RETRY_S = 0.1
MAX_RETRY_S = 2.0
MISSED_HEARTBEATS = 2
"""Heartbeats missed in a row after which the consumer is taken for lost (as nats-py counts them)."""
API_SID = b"1"
_LAST_CONSUMER = b"Nats-Last-Consumer:"
_STALLED = b"Nats-Consumer-Stalled:"


def ack_sequences(reply: bytes) -> tuple[int, int] | None:
    """(stream sequence, consumer sequence) from a JetStream delivery's reply subject, in either of its forms:
    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>` or, from servers that
    name a domain and account, `$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<stream seq>.<consumer
    seq>.<time>.<pending>[.<token>]`. None when it is neither."""
    if not reply.startswith(b"$JS.ACK."):
        return None
    tokens = reply.split(b".")
    n = len(tokens)
    try:
        if n == 9:
            return int(tokens[5]), int(tokens[6])
        if n >= 11:
            return int(tokens[7]), int(tokens[8])
    except ValueError:
        return None
    return None


def _header_value(header: bytes, name: bytes) -> bytes | None:
    at = header.find(name)
    if at < 0:
        return None
    end = header.find(b"\r\n", at)
    return header[at + len(name) : end if end >= 0 else len(header)].strip()


class OrderedReader:
    """Hands every message of `stream` matching `subjects` to `on_message`, in order, once each: from stream
    sequence `start_seq`, or (None) the last message of each subject and then every new one."""

    def __init__(
        self,
        url: str,
        stream: str,
        subjects: str,
        on_message: MessageHandler,
        *,
        start_seq: int | None = None,
        heartbeat_s: float = 1.0,
        inactive_s: float = 30.0,
        name: str = "chamber-follow",
        api_prefix: str = "$JS.API",
    ) -> None:
        parsed = urlparse(url.strip())
        self._host = parsed.hostname or "127.0.0.1"
        self._port = parsed.port or 4222
        self._options = connect_options(url.strip(), name)
        self.stream = stream
        self.subjects = subjects
        self.on_message = on_message
        self._start_seq = start_seq
        self._heartbeat_s = heartbeat_s
        self._inactive_s = inactive_s
        self._api = api_prefix
        self.last_sequence: int | None = None
        """The stream sequence of the last message handed over (None: none yet)."""
        self.resets = 0
        """How many times the consumer was made anew (a gap, missed heartbeats, a lost connection)."""
        self._cseq = 0
        self._sid = b""
        """The subscription of the consumer whose deliveries are read now (b"": none, until one is made anew)."""
        self._subscribed = b""
        self._consumer = ""
        self._sids = itertools.count(2)
        self._inbox = f"_INBOX.{secrets.token_hex(11)}.".encode()
        self._tokens = itertools.count()
        self._requests: dict[bytes, asyncio.Future[bytes]] = {}
        self._reset = asyncio.Event()
        self._active_at = 0.0
        self._protocol: PlainProtocol | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Connect and make the consumer; raises `BusError` (`Unsupported` for a server this cannot read) if that
        fails. Afterwards the reader keeps itself going until `stop`."""
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(started))
        try:
            await started
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            if self._consumer:
                protocol.write(self._delete_frame(self._consumer))
            protocol.close()

    # ---- reading (called by the protocol, on the event loop, for each chunk read) -----------------------------

    def _take(self, protocol: PlainProtocol, frames: list[Frame]) -> None:
        sid_now, on_message = self._sid, self.on_message
        active = False
        for subject, sid, reply, header, payload in frames:
            if sid != sid_now:
                if sid == API_SID:
                    future = self._requests.pop(subject, None)
                    if future is not None and not future.done():
                        future.set_result(payload)
                continue  # else a consumer given up, or none now
            active = True
            if header[8:9] == b" ":  # `NATS/1.0 <code> <description>`: a status from the server
                if header[9:12] != b"100":
                    status = header[9 : header.find(b"\r\n")].decode(errors="replace")
                    sid_now = self._give_up(f"status {status}")
                    continue
                if reply:  # a flow-control request: what came before it has been handed over
                    protocol.write(b"PUB %s 0\r\n\r\n" % reply)
                    continue
                stalled = _header_value(header, _STALLED)
                if stalled:
                    protocol.write(b"PUB %s 0\r\n\r\n" % stalled)
                last = _header_value(header, _LAST_CONSUMER)
                if last is not None and last.isdigit() and int(last) != self._cseq:
                    sid_now = self._give_up(f"the heartbeat says {int(last)} sent, {self._cseq} read")
                continue
            sequences = ack_sequences(reply)
            if sequences is None:
                continue
            stream_seq, consumer_seq = sequences
            if consumer_seq != self._cseq + 1:
                sid_now = self._give_up(f"delivery {consumer_seq} after {self._cseq}")
                continue
            self._cseq = consumer_seq
            self.last_sequence = stream_seq
            try:
                on_message(subject, header, payload, stream_seq)
            except Exception:  # one bad message never ends the follow
                log.exception("nats.follow_handler_failed", stream=self.stream, sequence=stream_seq)
        if active:
            self._active_at = asyncio.get_running_loop().time()

    def _give_up(self, why: str) -> bytes:
        """Stop reading the current consumer's deliveries (returns the subscription now read: none); `_run` makes a
        new consumer, from after the last message handed over."""
        log.warning("nats.follow_reset", stream=self.stream, why=why, after=self.last_sequence)
        self._sid = b""
        self._reset.set()
        return b""

    @property
    def label(self) -> str:
        return f"follow {self.stream}"

    def _lost(self, protocol: PlainProtocol, exc: Exception | None) -> None:
        if protocol is self._protocol:
            self._sid = b""
            for future in self._requests.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"connection closed: {exc}"))
            self._requests.clear()
            self._reset.set()

    # ---- keeping a consumer ---------------------------------------------------------------------------------

    async def _run(self, started: asyncio.Future[None]) -> None:
        delay = RETRY_S
        while not self._closed:
            protocol = self._protocol
            try:
                if protocol is None or protocol.closed:
                    protocol = None
                    protocol = self._protocol = await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT_S)
                await self._subscribe(protocol)
            except Unsupported as exc:
                if not started.done():
                    started.set_exception(exc)
                return
            except Exception as exc:  # (never let the follow end: a follower that stops hearing is silently stale)
                if isinstance(exc, TimeoutError) and protocol is not None:
                    protocol.close()  # no answer in time: the connection may be half-open
                if not isinstance(exc, OSError | ConnectionError | TimeoutError | BusError):
                    log.exception("nats.follow_failed", stream=self.stream)
                if not started.done():
                    started.set_exception(BusError(f"cannot follow {self.stream}: {exc}"))
                    return
                log.warning("nats.follow_retry", stream=self.stream, error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, MAX_RETRY_S)
                continue
            if not started.done():
                started.set_result(None)
            elif self.resets:
                log.info("nats.follow_resumed", stream=self.stream, after=self.last_sequence)
            delay = RETRY_S
            await self._watch(protocol)
            self.resets += 1

    async def _watch(self, protocol: PlainProtocol) -> None:
        """Until the consumer needs making anew: a reset asked for, the connection lost, or heartbeats missed."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reset.wait(), self._heartbeat_s)
            if self._reset.is_set() or protocol.closed:
                return
            if loop.time() - self._active_at > MISSED_HEARTBEATS * self._heartbeat_s + 0.5:
                self._give_up(f"no heartbeat for {loop.time() - self._active_at:.1f} s")
                return

    async def _connect(self) -> PlainProtocol:
        protocol = await connect_plain(
            self._host, self._port, self._options, self, b"SUB %s* %s\r\n" % (self._inbox, API_SID)
        )
        self._subscribed = b""  # (the consumer of a lost connection is deleted over the new one: `_subscribe`)
        return protocol

    async def _subscribe(self, protocol: PlainProtocol) -> None:
        """Make a consumer, delivering from after the last message handed over, on a new subscription (deliveries
        of the one given up that are still on their way are then told apart and dropped); delete the old one."""
        frames = b""
        if self._subscribed:
            frames += b"UNSUB %s\r\n" % self._subscribed
        if self._consumer:
            frames += self._delete_frame(self._consumer)
            self._consumer = ""
        sid = str(next(self._sids)).encode()
        deliver = f"_INBOX.{secrets.token_hex(11)}"
        config: dict[str, object] = {
            "deliver_subject": deliver, "ack_policy": "none", "max_deliver": 1, "filter_subject": self.subjects,
            "replay_policy": "instant", "flow_control": True, "idle_heartbeat": int(self._heartbeat_s * 1e9),
            "mem_storage": True, "num_replicas": 1, "inactive_threshold": int(self._inactive_s * 1e9),
        }  # fmt: skip
        start = self.last_sequence + 1 if self.last_sequence is not None else self._start_seq
        if start is None:
            config["deliver_policy"] = "last_per_subject"
        else:
            config["deliver_policy"], config["opt_start_seq"] = "by_start_sequence", max(1, start)
        request = json.dumps({"stream_name": self.stream, "config": config}).encode()
        token = self._inbox + str(next(self._tokens)).encode()
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._requests[token] = answer
        self._reset.clear()
        self._cseq = 0
        self._sid = self._subscribed = sid  # deliveries may come before the API's answer
        self._active_at = asyncio.get_running_loop().time()
        frames += b"SUB %s %s\r\nPUB %s.CONSUMER.CREATE.%s %s %d\r\n%s\r\n" % (
            deliver.encode(), sid, self._api.encode(), self.stream.encode(), token, len(request), request,
        )  # fmt: skip
        protocol.write(frames)
        try:
            payload = await asyncio.wait_for(answer, API_TIMEOUT_S)
        except BaseException:
            self._sid = b""
            self._requests.pop(token, None)
            raise
        try:
            reply = json.loads(payload)
        except ValueError:
            reply = None
        error = reply.get("error") if isinstance(reply, dict) else f"unreadable answer {payload[:80]!r}"
        if error:
            self._sid = b""
            why = error.get("description", error) if isinstance(error, dict) else error
            raise BusError(f"cannot make a consumer of {self.stream}: {why}")
        assert isinstance(reply, dict)
        self._consumer = str(reply.get("name", ""))

    def _delete_frame(self, consumer: str) -> bytes:
        return b"PUB %s.CONSUMER.DELETE.%s.%s 0\r\n\r\n" % (self._api.encode(), self.stream.encode(), consumer.encode())
