"""A durable pull consumer: decode, apply, and only then ack.

A message that does not decode is dead-lettered and terminated (it would never decode on redelivery). A handler
that raises gets the message redelivered with backoff; after `max_attempts` it is dead-lettered rather than
retried forever, so one poison message cannot stall a service. Except when what it raised says a dependency is
down (`outage`, e.g. the ledger unreachable): then no message is at fault, and every one is redelivered until the
dependency is back, however long that takes (a minute without Redis dead-lettered every job event of that minute).

With a batch handler, everything one fetch returned is applied in one call (the scheduler coalesces a burst of
submissions into one decision pass), then each message is acked; if the batch fails, its messages are retried
one by one, so a poison message is isolated and the rest go through.

At start, messages that an earlier instance of this consumer received but never acknowledged (it crashed
mid-batch) are replayed at once rather than after the ack wait (every handler is idempotent, so seeing them
again when JetStream redelivers them is harmless). Without this, jobs submitted just before a crash waited the
whole ack wait to be scheduled. The replayed range runs from the ack floor to the last delivery, so it also holds
messages that were handled and acked after the floor.

Events that may have been handled before (replayed, or redelivered: delivered more than once) go to
`recheck_handler` when one is given: a handler whose memory does not hold everything it ever handled (the
scheduler keeps only active jobs) checks those against what is stored instead of taking them as new. A consumer
whose handler counts what it is given (the health service counts the faults in telemetry against windows) keeps
the stream sequences it handled instead (`remember`: those within so many of the newest, `HandledSequences`): a
message delivered again whose ack was lost (a NATS restart, an ack wait passed while the service was busy), or
replayed at start and then redelivered, is acked without being handled a second time.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from chamber.common.bus.handled import HandledSequences
from chamber.common.bus.plain import Unsupported
from chamber.common.bus.plain_puller import PlainPuller
from chamber.common.bus.puller import Delivered, Puller
from chamber.common.bus.reading import read_stream
from chamber.common.codec import DecodeError, Decoder
from chamber.common.log import get_logger

if TYPE_CHECKING:
    from chamber.common.bus.client import Bus

log = get_logger(__name__)

T = TypeVar("T")
OUTAGE_RETRY_S = 5.0
"""While a dependency is down, its messages are redelivered at most this long apart."""
EventHandler = Callable[[T], Awaitable[None]]
BatchHandler = Callable[[list[T]], Awaitable[None]]


class Consumer(Generic[T]):
    def __init__(
        self,
        *,
        bus: "Bus",
        stream: str,
        durable: str,
        filter_subjects: list[str],
        decoder: Decoder,
        handler: EventHandler[T],
        batch_handler: BatchHandler[T] | None = None,
        recheck_handler: BatchHandler[T] | None = None,
        batch: int,
        ack_wait_s: float,
        max_attempts: int,
        outage: tuple[type[BaseException], ...] = (),
        remember: int = 0,
    ) -> None:
        self.bus = bus
        self.stream = stream
        self.durable = durable
        self.filter_subjects = filter_subjects
        self.decoder = decoder
        self.handler = handler
        self.batch_handler = batch_handler
        self.recheck_handler = recheck_handler
        self.batch = batch
        self.ack_wait_s = ack_wait_s
        self.max_attempts = max_attempts
        self.outage = outage
        self._task: asyncio.Task[None] | None = None
        self._puller: Puller | PlainPuller | None = None
        self._stopping = asyncio.Event()
        self.processed = 0
        self.rejected = 0
        self.replayed = 0
        self.remember = remember
        self._handled = HandledSequences(remember)
        """The stream sequences handled, within `remember` of the newest (0: none kept)."""
        self.duplicates = 0
        """Messages delivered again after they were handled, acked without handling them again."""

    async def start(self) -> None:
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.ack_wait_s,
            max_ack_pending=10_000,
            filter_subjects=self.filter_subjects if len(self.filter_subjects) > 1 else None,
            filter_subject=self.filter_subjects[0] if len(self.filter_subjects) == 1 else None,
        )
        await self.bus.js.add_consumer(self.stream, config)
        # Not add_consumer's answer: for a consumer that exists, the first answer after the server (re)loaded it
        # is the state at load time. After a NATS restart it said "delivered up to 5453" while 5660 had been
        # delivered, and the replay missed a submission a SIGKILLed scheduler had received (30 s late).
        info = await self.bus.js.consumer_info(self.stream, self.durable)
        await self._replay_unacked(info)
        puller = self._puller = await self._pull()
        self._task = asyncio.create_task(self._run(puller), name=f"consumer-{self.durable}")
        self._task.add_done_callback(self._on_done)

    async def _pull(self) -> Puller | PlainPuller:
        """Pull requests over a plain connection of their own where the bus has one (`PlainPuller`), else through
        nats-py (`Puller`)."""
        if self.bus.plain_url is not None:
            plain = PlainPuller(self.bus.plain_url, self.stream, self.durable, batch=self.batch,
                                name=f"chamber-{self.bus.service}")  # fmt: skip
            try:
                await plain.start()
                return plain
            except Unsupported:
                pass  # the server asks for TLS: nats-py's path
        puller = Puller(self.bus.nc, self.stream, self.durable, batch=self.batch)
        await puller.start()
        return puller

    def _on_done(self, task: "asyncio.Task[None]") -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("consumer.crashed", durable=self.durable, error=repr(task.exception()))

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None
        if self._puller is not None:
            puller, self._puller = self._puller, None
            left: list[Delivered] = []
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                left = list(await puller.stop())
            # Delivered here, never handled: another instance gets them soon, not after the ack wait. Not at once:
            # the pull requests this one left open (nothing cancels them) would take them again, into a dead inbox.
            for msg in left:
                await _settle(msg.nak(delay=puller.expires_s + 0.5))
            await puller.close()

    async def _replay_unacked(self, info: Any) -> None:
        if not info.num_ack_pending:
            return
        first, last = info.ack_floor.stream_seq + 1, info.delivered.stream_seq
        events: list[T] = []
        seqs: list[int] = []
        for subject in self.filter_subjects:
            async for msg in read_stream(self.bus.js, self.stream, subject, first_seq=first, last_seq=last):
                try:
                    events.append(self.decoder.decode(msg.data))
                except DecodeError:
                    continue  # dead-lettered when it is redelivered
                seqs.append(msg.metadata.sequence.stream)
        if not events:
            return
        log.info("consumer.replay_unacked", durable=self.durable, messages=len(events))
        try:
            if self.recheck_handler is not None:
                await self.recheck_handler(events)
            elif self.batch_handler is not None:
                await self.batch_handler(events)
            else:
                for event in events:
                    await self.handler(event)
        except Exception as exc:  # they are redelivered after the ack wait and handled then
            log.warning("consumer.replay_failed", durable=self.durable, error=repr(exc))
        else:
            self._remember(seqs)
        self.replayed += len(events)

    def _remember(self, seqs: list[int]) -> None:
        if self.remember:
            for seq in seqs:
                if seq:
                    self._handled.add(seq)

    async def _drop_handled(self, msgs: list[Delivered]) -> list[Delivered]:
        """`msgs` without those delivered again after this consumer handled them (acked now: see `remember`)."""
        if not len(self._handled):
            return msgs
        fresh: list[Delivered] = []
        for msg in msgs:
            delivered, seq = _ack_numbers(msg)
            if delivered > 1 and seq in self._handled:
                self.duplicates += 1
                await _settle(msg.ack())
            else:
                fresh.append(msg)
        return fresh

    async def _run(self, puller: Puller | PlainPuller) -> None:
        while not self._stopping.is_set():
            try:
                msgs: list[Delivered] = list(await puller.fetch(timeout_s=0.5))
                if not msgs:
                    continue
            except Exception as exc:  # never let the loop die: a dead consumer silently stalls the service
                if self._stopping.is_set() or self.bus.nc.is_closed:
                    return
                log.warning("consumer.fetch_failed", durable=self.durable, error=repr(exc))
                await asyncio.sleep(0.5)
                continue
            await self._take(msgs)

    async def _take(self, msgs: list[Delivered]) -> None:
        """Handle what one fetch returned: in one batch, or one by one."""
        msgs = await self._drop_handled(msgs)
        if self.batch_handler is not None and len(msgs) > 1:
            await self._process_batch(msgs)
        else:
            for msg in msgs:
                await self._process(msg)

    async def _process_batch(self, msgs: list[Delivered]) -> None:
        decoded: list[tuple[Delivered, T]] = []
        for msg in msgs:
            try:
                decoded.append((msg, self.decoder.decode(msg.data)))
            except DecodeError as exc:
                await self._reject(msg, exc)
        if not decoded:
            return
        assert self.batch_handler is not None
        handle = self.batch_handler
        if self.recheck_handler is not None and any(_redelivered(msg) for msg, _ in decoded):
            handle = self.recheck_handler  # the whole batch, so events about one job stay in order
        try:
            await handle([event for _, event in decoded])
        except self.outage as exc:
            await self._wait_out([msg for msg, _ in decoded], exc)
            return
        except Exception as exc:
            log.warning("consumer.batch_failed", durable=self.durable, size=len(decoded), error=repr(exc))
            for msg, event in decoded:
                await self._handle(msg, event)
            return
        self.processed += len(decoded)
        self._remember([_stream_seq(msg) for msg, _ in decoded] if self.remember else [])
        for msg, _ in decoded:
            await _settle(msg.ack())

    async def _reject(self, msg: Delivered, exc: DecodeError) -> None:
        self.rejected += 1
        log.warning("consumer.rejected", durable=self.durable, subject=msg.subject, error=str(exc)[:200])
        await self.bus.dead_letter(msg, f"undecodable: {exc}")
        await _settle(msg.term())

    async def _process(self, msg: Delivered) -> None:
        try:
            event = self.decoder.decode(msg.data)
        except DecodeError as exc:
            await self._reject(msg, exc)
            return
        await self._handle(msg, event)

    async def _handle(self, msg: Delivered, event: T) -> None:
        try:
            if self.recheck_handler is not None and _redelivered(msg):
                await self.recheck_handler([event])
            else:
                await self.handler(event)
        except self.outage as exc:
            await self._wait_out([msg], exc)
            return
        except Exception as exc:
            attempts = _deliveries(msg)
            if attempts >= self.max_attempts:
                log.error("consumer.gave_up", durable=self.durable, subject=msg.subject, attempts=attempts)
                await self.bus.dead_letter(msg, f"handler failed {attempts} times: {exc}")
                await _settle(msg.term())
            else:
                log.warning("consumer.handler_failed", durable=self.durable, subject=msg.subject, error=str(exc))
                await _settle(msg.nak(delay=min(0.2 * 2**attempts, 10.0)))
            return
        self.processed += 1
        if self.remember:
            self._remember([_stream_seq(msg)])
        await _settle(msg.ack())

    async def _wait_out(self, msgs: list[Delivered], exc: BaseException) -> None:
        """A dependency is down: redeliver the messages later (never dead-letter them: none is at fault) and pause
        before fetching more, which would fail the same way."""
        attempts = max(_deliveries(msg) for msg in msgs)
        delay = min(0.2 * 2**attempts, OUTAGE_RETRY_S)
        log.warning("consumer.dependency_down", durable=self.durable, messages=len(msgs), error=repr(exc),
                    retry_in_s=delay)  # fmt: skip
        for msg in msgs:
            await _settle(msg.nak(delay=delay))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)


def _redelivered(msg: Delivered) -> bool:
    return _deliveries(msg) > 1


def _ack_numbers(msg: Delivered) -> tuple[int, int]:
    """(how many times the message was delivered, its stream sequence), read off its ack subject
    (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>...`, or with a domain and account hash before the
    stream): asked of every message of every batch, and nats-py's `metadata` builds a record with a timestamp for it
    (2.5% of the scheduler's CPU in `chamber bench e2e`). (1, 0) for a reply that is no ack subject (nats-py's
    `metadata` refuses those too)."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) >= 9 and tokens[0] == "$JS" and tokens[1] == "ACK":
        at = 4 if len(tokens) == 9 else 6  # v1: 9 tokens; v2: 11 or more
        delivered, seq = tokens[at], tokens[at + 1]
        return max(int(delivered), 1) if delivered.isdigit() else 1, int(seq) if seq.isdigit() else 0
    return 1, 0


def _deliveries(msg: Delivered) -> int:
    return _ack_numbers(msg)[0]


def _stream_seq(msg: Delivered) -> int:
    return _ack_numbers(msg)[1]


async def _settle(awaitable: Awaitable[None]) -> None:
    """Ack/nak/term; a failure here only means redelivery, which every handler tolerates."""
    try:
        await awaitable
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        log.warning("consumer.settle_failed", error=str(exc))
