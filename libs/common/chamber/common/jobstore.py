"""The durable job records: a JetStream KV bucket, written only by the scheduler, read by everyone.

Writes are compare-and-set on the entry's revision, so a stale writer cannot overwrite a newer record. The
scheduler writes many records at once (`write_many`: async publishes with one wait for all acks) so a burst of
placements costs one round trip, not one per job.

The bucket keeps each job's last `JOB_HISTORY` versions, and that history is the log of the job's changes: a job's
timeline (`history`) and the chaos checker read it, the process executor follows it. The scheduler used to publish
every change again, as a `JobStateChanged` with the whole record, on `decisions.state.<job>`: three more stored
messages and acks a job, and ~12% of the NATS server's CPU in `chamber bench e2e`, for what the bucket held anyway.
Written once, a change cannot be stored without being announced either.
"""

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE, KeyValue

from chamber.common.bus import ORDERED_HEARTBEAT_S, Bus, BusError, WrongLastSequence, messages_left, read_stream
from chamber.common.bus.ordered import OrderedReader
from chamber.common.bus.plain import Unsupported
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import JobRecord
from chamber.common.log import get_logger
from chamber.common.subjects import JOBS_BUCKET

log = get_logger(__name__)

_decoder = Decoder(JobRecord)
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
MARKER_REASON = "Nats-Marker-Reason"
"""The header of an entry the server itself placed when a key expired or was removed (nats-server 2.11+)."""
UNLIMITED = 0
"""No limit on what a follow holds while its callback catches up. A follower falls behind in a burst (a few records
a job, at thousands of jobs a second) or while it takes in every current record at start. At a limit nats-py drops
what comes next as a slow consumer, and its ordered consumer does not notice the gap (it counts a message as seen
before queueing it): the record would be lost for good, and the quota service would count a finished job as
running until it restarts."""
FOLLOW_INACTIVE_S = 300.0
"""How long the server keeps the follow's consumer while its client is away (as nats-py's KV watcher does). The
server's default, 5 s, deleted it during a short disconnect, and the follower then heard nothing until the
missed heartbeats made nats-py recreate it (~13 s after reconnecting, measured)."""
PLAIN_FOLLOW_INACTIVE_S = 30.0
"""The same for a follow over a plain connection (`OrderedReader`), which makes a new consumer whenever its
connection comes back and deletes the one it gave up: the server only has to remove the consumer of a follower
that went away for good (or whose delete did not reach it), and 300 s of pushing to nobody was long for that."""
_KV_OP = KV_OP.encode()
_MARKER = MARKER_REASON.encode()


JOB_HISTORY = 64
"""Versions of each record the bucket keeps (JetStream's most): a job's changes, oldest first, for its timeline.
A job that changed more often than this (preempted and resumed dozens of times) tells only its latest changes."""


class StaleWrite(BusError):
    """The record changed since it was read."""


@dataclass(frozen=True, slots=True)
class Write:
    record: JobRecord
    revision: int
    """The revision the writer last saw; 0 to create (refused if the key exists)."""


class JobStore:
    def __init__(self, kv: KeyValue, bus: Bus) -> None:
        self.kv = kv
        self.bus = bus
        self.stream = f"KV_{bus.names.bucket(JOBS_BUCKET)}"
        self.prefix = f"$KV.{bus.names.bucket(JOBS_BUCKET)}."

    @classmethod
    async def open(cls, bus: Bus) -> "JobStore":
        return cls(await bus.key_value(JOBS_BUCKET, history=JOB_HISTORY), bus)

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
        (result,) = await self.write_many([Write(record, 0)])
        if isinstance(result, StaleWrite):
            return None
        if isinstance(result, BusError):
            raise result
        return result

    async def update(self, record: JobRecord, revision: int) -> int:
        (result,) = await self.write_many([Write(record, revision)])
        if isinstance(result, BusError):
            raise result
        return result

    async def write_many(self, writes: Sequence[Write]) -> list[int | BusError]:
        """Write every record with compare-and-set on its revision, waiting once for all acks. Each result is
        the new revision, `StaleWrite` (the record changed, or already exists for a create) or another error."""
        items = [
            (f"{self.prefix}{w.record.id}", encode(w.record), {EXPECTED_LAST_SUBJECT_SEQUENCE: str(w.revision)})
            for w in writes
        ]
        out: list[int | BusError] = []
        for write, result in zip(writes, await self.bus.publish_many(items), strict=True):
            if isinstance(result, WrongLastSequence):
                out.append(StaleWrite(f"job {write.record.id} changed since revision {write.revision}"))
            elif isinstance(result, BusError):
                out.append(result)
            else:
                out.append(result.seq)
        return out

    async def history(self, job_id: str) -> list[JobRecord]:
        """The job's stored versions, oldest first (at most `JOB_HISTORY`; none after a delete or a purge)."""
        versions: list[JobRecord] = []
        try:
            async for msg in read_stream(self.bus.js, self.stream, f"{self.prefix}{job_id}", idle_s=2.0):
                op = (msg.headers or {}).get("KV-Operation")
                if op in (KV_DEL, KV_PURGE) or not msg.data:
                    versions.clear()
                    continue
                try:
                    versions.append(_decoder.decode(msg.data))
                except DecodeError:
                    log.error("jobstore.undecodable_record", job_id=job_id)
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the history of job {job_id}: {exc}") from exc
        return versions

    async def snapshot(self) -> tuple[dict[str, tuple[JobRecord, int]], int]:
        """Every current record (`load_all`), and a stream sequence that every write the records may miss comes
        after: follow from it (`follow(after=...)`) rather than take in every record a second time."""
        last = await self.last_sequence()
        return await self.load_all(), last

    async def written_between(self, after: int, end: int) -> bool:
        """Whether a write with a stream sequence in (after, end] is still stored."""
        return await messages_left(self.bus.js, self.stream, f"{self.prefix}>", after, end)

    async def last_sequence(self) -> int:
        """The stream sequence of the bucket's last write so far."""
        try:
            return int((await self.bus.js.stream_info(self.stream)).state.last_seq)
        except nats.errors.Error as exc:
            raise BusError(f"cannot read the job records: {exc}") from exc

    async def load_all(self) -> dict[str, tuple[JobRecord, int]]:
        """Every current record, read to the end of the bucket's stream.

        Not with a KV watcher: nats-py's watcher may signal "initial values done" before it has handed over
        messages already delivered to the client (it compares the consumer's pending count, which is 0 once
        everything is delivered, with the messages its callback has processed), and a scheduler that starts
        from a partial view releases live claims and ignores the reports of the jobs it missed.
        """
        records: dict[str, tuple[JobRecord, int]] = {}
        async for msg in read_stream(
            self.bus.js, self.stream, f"{self.prefix}>", deliver=DeliverPolicy.LAST_PER_SUBJECT, idle_s=2.0
        ):
            op = (msg.headers or {}).get("KV-Operation")
            key = msg.subject[len(self.prefix) :]
            if op in (KV_DEL, KV_PURGE) or not msg.data:
                records.pop(key, None)
                continue
            try:
                records[key] = (_decoder.decode(msg.data), msg.metadata.sequence.stream)
            except DecodeError:
                log.error("jobstore.undecodable_record", job_id=key)
        return records

    async def follow(
        self, on_record: Callable[[JobRecord], None], *, after: int | None = None
    ) -> Callable[[], Awaitable[None]]:
        """Call `on_record` for every current record and every later change; returns a stop function. With `after`
        (a stream sequence, from `snapshot`), only the writes after it: those the snapshot may not hold. A write
        that removed its key is left out.

        An ordered consumer of the bucket's stream (the last entry of each key, then every new one), not nats-py's
        KV watcher (`_follow`)."""
        prefix = self.prefix

        def on_entry(key: str, value: bytes | None, sequence: int) -> None:
            if value is None:
                return
            try:
                record = _decoder.decode(value)
            except DecodeError:
                log.error("jobstore.undecodable_record", job_id=key)
                return
            try:
                on_record(record)
            except Exception as exc:  # one bad record never ends the follow
                log.error("jobstore.follow_failed", job_id=record.id, error=repr(exc), prefix=prefix)

        return await self._follow(on_entry, after)

    async def follow_entries(
        self, on_entry: Callable[[str, JobRecord | None, int], None], *, after: int
    ) -> Callable[[], Awaitable[None]]:
        """Call `on_entry(job id, record, stream sequence)` for every write after stream sequence `after` (from
        `snapshot`), once each, in order; the record is None where the write removed the key (a delete or a purge)
        or holds no record (undecodable), as `load_all` would then not return it. Returns a stop function.

        A write at or before the last one handed over is skipped before it is decoded: nats-py recreates a lost
        ordered consumer (a NATS restart, a pause past its inactive threshold) from the last sequence it delivered,
        which is 0 when it delivered none yet, and the whole bucket then came again."""
        handed = after

        def on_write(key: str, value: bytes | None, sequence: int) -> None:
            nonlocal handed
            if sequence <= handed:
                return
            handed = sequence
            record = None
            if value is not None:
                try:
                    record = _decoder.decode(value)
                except DecodeError:
                    log.error("jobstore.undecodable_record", job_id=key)
            try:
                on_entry(key, record, sequence)
            except Exception as exc:  # one bad entry never ends the follow
                log.error("jobstore.follow_failed", job_id=key, error=repr(exc))

        return await self._follow(on_write, after)

    async def _follow(
        self, on_write: Callable[[str, bytes | None, int], None], after: int | None
    ) -> Callable[[], Awaitable[None]]:
        """Hand `on_write(key, value or None where the write removed the key, stream sequence)` every write of the
        bucket, in order: from after stream sequence `after`, or (None) the last of each key and every later one.

        Over a plain connection of its own where the bus has one (`OrderedReader`: the gateway, the quota service
        and the collector follow three writes a job, and nats-py's ordered consumer cost ~14 us of CPU a message
        against ~3 us there), else through nats-py's ordered consumer, with the callback on its subscription."""
        if self.bus.plain_url is not None:
            try:
                return await self._follow_plain(self.bus.plain_url, on_write, after)
            except Unsupported:
                pass  # the server asks for TLS: nats-py's consumer it is
            except BusError as exc:
                raise BusError(f"cannot follow the job records: {exc}") from exc
        prefix = self.prefix

        async def on_msg(msg: Msg) -> None:
            try:
                headers = msg.headers
                removed = not msg.data or (headers and (KV_OP in headers or MARKER_REASON in headers))
                on_write(msg.subject[len(prefix) :], None if removed else msg.data, msg.metadata.sequence.stream)
            except Exception as exc:  # one bad entry never ends the follow
                log.error("jobstore.follow_failed", subject=msg.subject, error=repr(exc))

        try:
            sub = await self.bus.js.subscribe(
                f"{self.prefix}>", cb=on_msg, ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT if after is None else DeliverPolicy.BY_START_SEQUENCE,
                config=None if after is None else ConsumerConfig(opt_start_seq=after + 1),
                pending_msgs_limit=UNLIMITED, pending_bytes_limit=UNLIMITED, inactive_threshold=FOLLOW_INACTIVE_S,
                idle_heartbeat=ORDERED_HEARTBEAT_S,
            )  # fmt: skip
        except nats.errors.Error as exc:
            raise BusError(f"cannot follow the job records: {exc}") from exc

        async def stop() -> None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()

        return stop

    async def _follow_plain(
        self, url: str, on_write: Callable[[str, bytes | None, int], None], after: int | None
    ) -> Callable[[], Awaitable[None]]:
        skip = len(self.prefix)

        def on_message(subject: bytes, header: bytes, payload: bytes, sequence: int) -> None:
            removed = not payload or (header and (_KV_OP in header or _MARKER in header))
            on_write(subject[skip:].decode(errors="replace"), None if removed else payload, sequence)

        reader = OrderedReader(
            url, self.stream, f"{self.prefix}>", on_message, start_seq=None if after is None else after + 1,
            heartbeat_s=ORDERED_HEARTBEAT_S, inactive_s=PLAIN_FOLLOW_INACTIVE_S,
            name=f"chamber-{self.bus.service}-records",
        )  # fmt: skip
        await reader.start()
        return reader.stop
