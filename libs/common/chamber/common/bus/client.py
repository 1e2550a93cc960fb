"""Connect with retry, declare streams idempotently, publish with de-duplication, drain on shutdown."""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    DeliverPolicy,
    DiscardPolicy,
    PubAck,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue

from chamber.common.bus.consumer import BatchHandler, Consumer, EventHandler
from chamber.common.bus.direct import DirectAckPipeline, direct_supported
from chamber.common.bus.errors import BusError, BusUnavailable, PublishError
from chamber.common.bus.pipeline import AckPipeline
from chamber.common.bus.puller import Delivered
from chamber.common.bus.reading import read_stream
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.log import get_logger
from chamber.common.subjects import STREAMS, Names, StreamSpec
from chamber.common.urls import redact

log = get_logger(__name__)

MSG_ID = "Nats-Msg-Id"
DEDUP_WINDOW_S = 120.0
RECONNECT_WAIT_S = 0.5
ORDERED_HEARTBEAT_S = 1.0
"""The idle heartbeat of every ordered consumer (the job-record follows, state watches, the process executor's
reports). A NATS restart loses such a consumer (it is kept in memory), and nats-py recreates it, from the last
message it handed over, only once two heartbeats in a row are missed: with the default of 5 s a follow heard
nothing of the writes made after a restart for another ~15 s (measured: the gateway served stale jobs, a standby
scheduler's view stood still); with 1 s it is recreated while JetStream comes back. An idle consumer receives one
heartbeat a second."""


class Bus:
    """One NATS connection with JetStream, scoped to a namespace (and, where the URL allows, a second plain one for
    the publishes that wait for their ack: `DirectAckPipeline`)."""

    def __init__(self, nc: Client, names: Names, service: str, *, direct_url: str | None = None) -> None:
        """`direct_url`: the server's URL, for JetStream publishes over a connection of their own where it is a
        single plain `nats://` one (`DirectAckPipeline`); without it they go through nats-py (`AckPipeline`)."""
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.names = names
        self.service = service
        self._consumers: list[Consumer[Any]] = []
        self._subscriptions: list[Any] = []
        self._pipeline: AckPipeline | DirectAckPipeline = AckPipeline(nc)
        self.plain_url: str | None = None
        """The server's URL where connections of their own may be made to it (`DirectAckPipeline`, and the job-record
        follows' `OrderedReader`): a single plain `nats://` server; None otherwise (nats-py does it all)."""
        if direct_url is not None and direct_supported(direct_url):
            self.plain_url = direct_url.strip()
            self._pipeline = DirectAckPipeline(direct_url, self._pipeline, name=f"chamber-{service}")
        self.replicas = 1
        """Copies of each stream and KV bucket this bus makes (`Settings.nats_replicas`)."""

    @classmethod
    async def connect(
        cls, url: str, names: Names, service: str, *, timeout_s: float = 30.0, replicas: int = 1, direct: bool = True
    ) -> "Bus":
        """Connect, retrying until `timeout_s` (then `BusUnavailable` with the last error); afterwards nats-py
        reconnects by itself forever. nats-py retries a first connection forever too when reconnecting is allowed,
        so the wait is bounded here, and the half-made client closed. `direct`: JetStream publishes over a
        connection of their own where the URL allows (`DirectAckPipeline`)."""
        last: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            last[:] = [exc]
            await _log_error(exc)

        nc = Client()
        try:
            await asyncio.wait_for(
                nc.connect(
                    url,
                    name=f"chamber-{service}",
                    connect_timeout=2,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=RECONNECT_WAIT_S,  # type: ignore[arg-type]  # a float works (seconds)
                    error_cb=on_error,
                    disconnected_cb=_log_disconnected,
                    reconnected_cb=_log_reconnected,
                ),
                timeout=timeout_s,
            )
        except BaseException as exc:  # a timeout, a refusal, or cancelled: no half-made client left behind
            with contextlib.suppress(Exception):
                await asyncio.shield(nc.close())
            if not isinstance(exc, TimeoutError | OSError | nats.errors.Error):
                raise
            cause = last[0] if last else exc
            raise BusUnavailable(f"cannot reach NATS at {redact(url)} within {timeout_s:g} s: {cause}") from exc
        bus = cls(nc, names, service, direct_url=url if direct else None)
        bus.replicas = replicas
        return bus

    async def ensure_streams(self, specs: tuple[StreamSpec, ...] = STREAMS) -> None:
        """Create each stream, or update it to the declared configuration; safe to call from every service."""
        for spec in specs:
            config = self.stream_config(spec)
            try:
                await self.js.stream_info(config.name or "")
            except nats.js.errors.NotFoundError:
                try:
                    await self.js.add_stream(config)
                    continue
                except nats.js.errors.BadRequestError:
                    pass  # created concurrently by another service: fall through to update
            except nats.errors.Error as exc:
                raise BusError(f"cannot inspect stream {config.name}: {exc}") from exc
            try:
                await self.js.update_stream(config)
            except nats.errors.Error as exc:
                raise BusError(f"cannot update stream {config.name}: {exc}") from exc

    def stream_config(self, spec: StreamSpec) -> StreamConfig:
        return StreamConfig(
            name=self.names.stream(spec),
            subjects=[self.names.subject(spec.subjects)],
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=spec.max_age_s,
            max_bytes=spec.max_bytes,
            max_msgs_per_subject=spec.max_msgs_per_subject or -1,
            duplicate_window=DEDUP_WINDOW_S,
            allow_direct=True,
            num_replicas=self.replicas,
        )

    async def publish(self, subject: str, event: msgspec.Struct, *, msg_id: str | None = None) -> PubAck:
        """Publish to JetStream and wait for the store's ack. `msg_id` makes retries harmless (de-duplicated)."""
        headers = {MSG_ID: msg_id} if msg_id else None
        (result,) = await self._pipeline.publish_many([(subject, encode(event), headers)])
        if isinstance(result, BusError):
            raise type(result)(f"publish to {subject}: {result}")
        return result

    async def publish_nowait(self, subject: str, event: msgspec.Struct) -> None:
        """Fire and forget (core NATS; a stream on the subject still stores it). For telemetry: a sample lost to
        a broken connection is replaced by the next one, and waiting for an ack per node would cap throughput."""
        try:
            await self.nc.publish(subject, encode(event))
        except nats.errors.Error as exc:
            raise PublishError(f"publish to {subject} failed: {exc}") from exc

    async def publish_raw(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> PubAck:
        try:
            return await self.js.publish(subject, data, headers=headers, timeout=5.0)
        except nats.errors.Error as exc:
            raise PublishError(f"publish to {subject} not acknowledged: {exc}") from exc

    async def dead_letter(self, msg: Delivered, reason: str) -> None:
        """Keep a message no consumer can use, with why, for an operator; never raise."""
        headers = {
            "Chamber-Reason": reason[:1000],
            "Chamber-Subject": msg.subject,
            "Chamber-Service": self.service,
        }
        try:
            await self.publish_raw(self.names.deadletter(self.service), msg.data, headers)
        except PublishError as exc:
            log.error("deadletter.publish_failed", subject=msg.subject, error=str(exc))

    def consumer(
        self,
        *,
        stream: StreamSpec,
        durable: str,
        filter_subjects: list[str],
        decoder: Decoder,
        handler: EventHandler[Any],
        batch_handler: BatchHandler[Any] | None = None,
        recheck_handler: BatchHandler[Any] | None = None,
        batch: int = 64,
        ack_wait_s: float = 30.0,
        max_attempts: int = 10,
        outage: tuple[type[BaseException], ...] = (),
        remember: int = 0,
    ) -> Consumer[Any]:
        """A durable pull consumer with explicit acks; start it with `await consumer.start()`. With
        `batch_handler`, each fetched batch is handled in one call (one ack per message after it); a batch that
        fails is retried message by message through `handler`, so a poison message is isolated. Replayed and
        redelivered events go to `recheck_handler` when given; a handler raising one of `outage` (a dependency
        down) gets its messages redelivered until it is back, never dead-lettered; with `remember`, a message
        delivered again after it was handled is acked, not handled again (see `Consumer`)."""
        consumer: Consumer[Any] = Consumer(
            bus=self,
            stream=self.names.stream(stream),
            durable=durable,
            filter_subjects=filter_subjects,
            decoder=decoder,
            handler=handler,
            batch_handler=batch_handler,
            recheck_handler=recheck_handler,
            batch=batch,
            ack_wait_s=ack_wait_s,
            max_attempts=max_attempts,
            outage=outage,
            remember=remember,
        )
        self._consumers.append(consumer)
        return consumer

    async def watch_latest(
        self, subject: str, decoder: Decoder, callback: Callable[[Any], Awaitable[None] | None]
    ) -> None:
        """Follow the last message per subject (then every new one) with an ordered, ephemeral consumer.

        For state streams (inventory, quota state) where only the latest value matters. Garbage is logged
        and skipped.
        """

        async def on_msg(msg: Msg) -> None:
            try:
                value = decoder.decode(msg.data)
            except DecodeError as exc:
                log.warning("watch.undecodable", subject=msg.subject, error=str(exc))
                return
            try:
                result = callback(value)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("watch.callback_failed", subject=msg.subject)

        sub = await self.js.subscribe(
            subject, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            idle_heartbeat=ORDERED_HEARTBEAT_S,
        )  # fmt: skip
        self._subscriptions.append(sub)

    async def read_latest(self, stream: StreamSpec, subject: str, decoder: Decoder) -> list[Any]:
        """The last message of every subject matching `subject`, decoded (garbage skipped). For start-up state."""
        values: list[Any] = []
        async for msg in read_stream(
            self.js, self.names.stream(stream), subject, deliver=DeliverPolicy.LAST_PER_SUBJECT
        ):
            try:
                values.append(decoder.decode(msg.data))
            except DecodeError as exc:
                log.warning("read_latest.undecodable", subject=msg.subject, error=str(exc))
        return values

    async def read_since(self, stream: StreamSpec, subject: str, since: float, decoder: Decoder) -> list[Any]:
        """Every message on `subject` stored at or after `since` (epoch seconds), decoded (garbage skipped)."""
        values: list[Any] = []
        async for msg in read_stream(self.js, self.names.stream(stream), subject, since=since, idle_s=0.5):
            try:
                values.append(decoder.decode(msg.data))
            except DecodeError:
                continue
        return values

    async def publish_many(self, items: Sequence[tuple[str, bytes, dict[str, str] | None]]) -> list[PubAck | BusError]:
        """Publish many messages with one wait for all their acks: they are all in flight at once. Each result is
        the ack or the error for that message, in order; nothing raises, so one refusal does not hide the rest."""
        return await self._pipeline.publish_many(items)

    async def key_value(self, bucket: str, *, history: int = 1) -> KeyValue:
        """The bucket, made if it is not there; one made before with fewer copies, or a shorter `history`, gets
        them now (an upgrade)."""
        name = self.names.bucket(bucket)
        try:
            kv = await self.js.key_value(name)
            await self.scale_bucket(name, history)
            return kv
        except nats.js.errors.BucketNotFoundError:
            try:
                return await self.js.create_key_value(
                    bucket=name, history=history, storage=StorageType.FILE, replicas=self.replicas
                )
            except nats.js.errors.BadRequestError:
                return await self.js.key_value(name)

    async def scale_bucket(self, name: str, history: int = 1) -> None:
        """A KV bucket made with fewer copies than `replicas` (before a cluster grew) is scaled to it; one that keeps
        fewer versions of a key than `history` keeps that many from now on."""
        try:
            info = await self.js.stream_info(f"KV_{name}")
            config = info.config
            if (self.replicas <= 1 or config.num_replicas == self.replicas) and (
                config.max_msgs_per_subject or 0
            ) >= history:
                return
            if self.replicas > 1:
                config.num_replicas = self.replicas
            config.max_msgs_per_subject = max(config.max_msgs_per_subject or 0, history)
            await self.js.update_stream(config)
        except nats.errors.Error as exc:
            raise BusError(f"cannot update bucket {name} ({self.replicas} copies, history {history}): {exc}") from exc

    async def last_message(self, stream: StreamSpec, subject: str) -> bytes | None:
        try:
            raw = await self.js.get_last_msg(self.names.stream(stream), subject)
        except nats.js.errors.NotFoundError:
            return None
        return raw.data

    async def last_message_of(self, stream: StreamSpec) -> bytes | None:
        """The data of the last message stored in `stream` (any subject), or None when it is empty."""
        name = self.names.stream(stream)
        try:
            info = await self.js.stream_info(name)
            if info.state.messages == 0 or not info.state.last_seq:
                return None
            return (await self.js.get_msg(name, seq=info.state.last_seq)).data
        except nats.js.errors.NotFoundError:
            return None
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the last message of {name}: {exc}") from exc

    async def close(self) -> None:
        """Stop consumers (in-flight handlers finish and ack), then drain the connection."""
        for consumer in self._consumers:
            await consumer.stop()
        await self._pipeline.close()
        for sub in self._subscriptions:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if not self.nc.is_closed:
            try:
                await self.nc.drain()
            except nats.errors.Error as exc:
                log.warning("nats.drain_failed", error=str(exc))


async def _log_error(exc: Exception) -> None:
    log.warning("nats.error", error=str(exc))


async def _log_disconnected() -> None:
    log.warning("nats.disconnected")


async def _log_reconnected() -> None:
    log.info("nats.reconnected")
