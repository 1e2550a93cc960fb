"""Reading a run's evidence back from NATS: every message of a stream, every stored version of every job's record
(the bucket's history: the log of the job's changes), dead letters."""

from typing import Any

import nats
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from chamber.common.codec import DecodeError, Decoder
from chamber.common.contracts import Decision, JobEvent, JobRecord, JobStateChanged
from chamber.common.subjects import DEADLETTER, DECISIONS, JOBS, JOBS_BUCKET, Names
from tests.chaos.checker import Evidence, Fault


async def read_stream(js: JetStreamContext, stream: str, subject: str) -> list[Msg]:
    """Every message stored in `stream` on `subject` (a wildcard), in order."""
    try:
        info = await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return []
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=60.0)
    psub = await js.pull_subscribe(subject, stream=stream, config=config)
    out: list[Msg] = []
    try:
        while True:
            try:
                msgs = await psub.fetch(1000, timeout=2)
            except (nats.errors.TimeoutError, TimeoutError):
                break
            out += msgs
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
    finally:
        await psub.unsubscribe()
    if len(out) < info.state.messages:
        raise RuntimeError(f"read {len(out)} of the {info.state.messages} messages in {stream}")
    return out


def _decode_all(msgs: list[Msg], decoder: Decoder, what: str) -> list[Any]:
    out = []
    for msg in msgs:
        try:
            out.append(decoder.decode(msg.data))
        except DecodeError as exc:
            raise AssertionError(f"an undecodable {what} in the stream: {exc}") from exc
    return out


async def collect(
    nats_url: str,
    namespace: str,
    *,
    accepted: set[str],
    faults: list[Fault],
    gpus_allocated_at_end: int | None,
    started_at: float,
) -> Evidence:
    names = Names(namespace)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        events = _decode_all(
            await read_stream(js, names.stream(JOBS), names.subject("jobs.>")), Decoder(JobEvent), "job event"
        )
        decisions = _decode_all(
            await read_stream(js, names.stream(DECISIONS), names.subject("decisions.>")), Decoder(Decision), "decision"
        )
        bucket = names.bucket(JOBS_BUCKET)
        record_decoder = Decoder(JobRecord)
        records: dict[str, JobRecord] = {}
        for msg in await read_stream(js, f"KV_{bucket}", f"$KV.{bucket}.>"):  # every version, in the order written
            key = msg.subject.removeprefix(f"$KV.{bucket}.")
            if (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
                records.pop(key, None)
                continue
            record = record_decoder.decode(msg.data)
            previous = records.get(key)
            decisions.append(JobStateChanged(record=record, previous=previous.state.value if previous else "",
                                             at=record.updated_at))  # fmt: skip
            records[key] = record
        dead = [
            {
                "service": (m.headers or {}).get("Chamber-Service", ""),
                "subject": (m.headers or {}).get("Chamber-Subject", ""),
                "reason": (m.headers or {}).get("Chamber-Reason", "")[:300],
            }
            for m in await read_stream(js, names.stream(DEADLETTER), names.subject("deadletter.>"))
        ]
    finally:
        await nc.close()
    return Evidence(
        accepted=accepted, events=events, decisions=decisions, records=records, faults=faults, dead_letters=dead,
        gpus_allocated_at_end=gpus_allocated_at_end, started_at=started_at,
    )  # fmt: skip
