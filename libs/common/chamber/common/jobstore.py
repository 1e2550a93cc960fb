"""The durable job records: a JetStream KV bucket, written only by the scheduler, read by everyone.

Writes are compare-and-set on the entry's revision, so a stale writer cannot overwrite a newer record.
"""

from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from chamber.common.bus.errors import BusError
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import JobRecord
from chamber.common.log import get_logger

log = get_logger(__name__)

_decoder = Decoder(JobRecord)


class StaleWrite(BusError):
    """The record changed since it was read."""


class JobStore:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, job_id: str) -> tuple[JobRecord, int] | None:
        try:
            entry = await self.kv.get(job_id)
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.errors.Error as exc:
            raise BusError(f"cannot read job {job_id}: {exc}") from exc
        if entry.value is None:
            return None
        try:
            return _decoder.decode(entry.value), entry.revision or 0
        except DecodeError:
            log.error("jobstore.undecodable_record", job_id=job_id)
            return None

    async def create(self, record: JobRecord) -> int | None:
        """Store a new record; None when one already exists (the submit was a duplicate)."""
        try:
            return await self.kv.create(record.id, encode(record))
        except nats.js.errors.KeyWrongLastSequenceError:
            return None
        except nats.errors.Error as exc:
            raise BusError(f"cannot create job {record.id}: {exc}") from exc

    async def update(self, record: JobRecord, revision: int) -> int:
        try:
            return await self.kv.update(record.id, encode(record), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise StaleWrite(f"job {record.id} changed since revision {revision}") from exc
        except nats.errors.Error as exc:
            raise BusError(f"cannot update job {record.id}: {exc}") from exc

    async def load_all(self) -> dict[str, tuple[JobRecord, int]]:
        """Every current record, read to the end of the bucket's stream.

        Not with a KV watcher: nats-py's watcher may signal "initial values done" before it has handed over
        messages already delivered to the client (it compares the consumer's pending count, which is 0 once
        everything is delivered, with the messages its callback has processed), and a scheduler that starts
        from a partial view releases live claims and ignores the reports of the jobs it missed.
        """
        js = self.kv._js
        stream = self.kv._stream
        prefix = self.kv._pre
        records: dict[str, tuple[JobRecord, int]] = {}
        try:
            info = await js.stream_info(stream)
            if info.state.messages == 0:
                return records
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE, inactive_threshold=30.0
            )
            psub = await js.pull_subscribe(f"{prefix}>", stream=stream, config=config)
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the job records: {exc}") from exc
        try:
            done = False
            while not done:
                try:
                    msgs = await psub.fetch(1024, timeout=2.0)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                for msg in msgs:
                    done = done or msg.metadata.num_pending == 0
                    op = (msg.headers or {}).get("KV-Operation")
                    key = msg.subject[len(prefix) :]
                    if op in (KV_DEL, KV_PURGE) or not msg.data:
                        records.pop(key, None)
                        continue
                    try:
                        records[key] = (_decoder.decode(msg.data), msg.metadata.sequence.stream)
                    except DecodeError:
                        log.error("jobstore.undecodable_record", job_id=key)
        finally:
            await psub.unsubscribe()
        return records

    async def follow(self, on_record: Callable[[JobRecord], Awaitable[None] | None]) -> Callable[[], Awaitable[None]]:
        """Call `on_record` for every current record and every later change; returns a stop function."""
        import asyncio

        watcher = await self.kv.watchall()

        async def pump() -> None:
            async for entry in watcher:
                if entry is None or entry.value is None or entry.operation in (KV_DEL, KV_PURGE):
                    continue
                try:
                    record = _decoder.decode(entry.value)
                except DecodeError:
                    continue
                result = on_record(record)
                if result is not None:
                    await result

        task = asyncio.create_task(pump(), name="jobstore-follow")
        task.add_done_callback(
            lambda t: (
                t.cancelled()
                or t.exception() is None
                or log.error("jobstore.follow_crashed", error=repr(t.exception()))
            )
        )

        async def stop() -> None:
            await watcher.stop()  # type: ignore[no-untyped-call]
            task.cancel()

        return stop
