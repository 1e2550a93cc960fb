"""Reading a stream to its end: start-up state (last value per subject, the job records, a time window) and the
replay of messages a crashed consumer had received but not acknowledged.

One helper instead of a loop in every caller: an ephemeral, unacknowledged pull consumer from the chosen start,
fetched in batches up to the end: the stream's last sequence when the read began (or, for a range, the last
sequence wanted). The consumer's own count of what is left (`num_pending`) is only a hint: it was seen at 0 three
messages short of the end, and a read that stopped there replayed a crashed scheduler's unacknowledged range
without its last submissions (those jobs then waited for the 30 s redelivery); a start-up read of the job records
could have missed records the same way. So before a read stops short of the end, a direct lookup
(`next_by_subj`) confirms that nothing matching is left. The hint is asked once before the first fetch too: where
nothing matches (the history of a job never stored, a job not yet placed, a window with no rollup) a fetch would
wait out its whole idle time, and the lookup answers at once. No client-library internals are used, only the
documented consumer and stream APIs.
"""

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from chamber.common.bus.errors import BusError

STALLS = 3
"""Fetches that may come back empty while a lookup says messages are left, before the read gives up."""


async def read_stream(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    deliver: DeliverPolicy = DeliverPolicy.ALL,
    since: float | None = None,
    first_seq: int | None = None,
    last_seq: int | None = None,
    batch: int = 1024,
    idle_s: float = 1.0,
) -> AsyncIterator[Msg]:
    """Every message of `stream` on `subject` from the start chosen by `deliver` (`since`: epoch seconds with
    BY_START_TIME; `first_seq` with BY_START_SEQUENCE) to the end of the stream, or to `last_seq`. Raises BusError
    when the stream cannot be read or messages known to be left are not delivered."""
    try:
        info = await js.stream_info(stream)
    except nats.errors.Error as exc:
        raise BusError(f"cannot read stream {stream}: {exc}") from exc
    end = info.state.last_seq if last_seq is None else min(last_seq, info.state.last_seq)
    if info.state.messages == 0 or (first_seq is not None and first_seq > end):
        return
    config = ConsumerConfig(deliver_policy=deliver, ack_policy=AckPolicy.NONE, inactive_threshold=30.0)
    if since is not None:
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = datetime.fromtimestamp(max(since, 0.0), UTC)
    if first_seq is not None:
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = first_seq
    latest_only = config.deliver_policy == DeliverPolicy.LAST_PER_SUBJECT
    try:
        psub = await js.pull_subscribe(subject, stream=stream, config=config)
    except nats.errors.Error as exc:
        raise BusError(f"cannot read {subject} from {stream}: {exc}") from exc
    seen: int | None = None
    """The last stream sequence delivered (None: nothing yet)."""
    stalls = 0
    try:
        first = await psub.consumer_info()
        if not first.num_pending:  # nothing to fetch, unless the hint is wrong: a fetch would wait `idle_s` for it
            seen = first.delivered.stream_seq if first.delivered is not None else 0
            if not await _left(js, stream, subject, seen, end, latest_only=latest_only):
                return
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=idle_s)
            except (nats.errors.TimeoutError, TimeoutError):
                msgs = []
            for msg in msgs:
                seq = msg.metadata.sequence.stream
                if last_seq is not None and seq > last_seq:
                    return
                seen = seq
                yield msg
                if seq >= end:
                    return
            if msgs and msgs[-1].metadata.num_pending > 0:
                continue
            if seen is None:
                delivered = (await psub.consumer_info()).delivered
                seen = delivered.stream_seq if delivered is not None else 0
            if not await _left(js, stream, subject, seen, end, latest_only=latest_only):
                return
            stalls = 0 if msgs else stalls + 1
            if stalls >= STALLS:
                raise BusError(f"reading {subject} from {stream}: messages after {seen} are left but not delivered")
    except nats.errors.Error as exc:
        raise BusError(f"cannot read {subject} from {stream}: {exc}") from exc
    finally:
        await psub.unsubscribe()


async def messages_left(js: JetStreamContext, stream: str, subject: str, after: int, end: int) -> bool:
    """Is a message on `subject` with a sequence in (after, end] still stored? (A follower that has taken in every
    write up to `after` has then seen all there is up to `end`, whatever was removed meanwhile.)"""
    try:
        return await _left(js, stream, subject, after, end, latest_only=False)
    except nats.errors.Error as exc:
        raise BusError(f"cannot read {subject} from {stream}: {exc}") from exc


async def _left(js: JetStreamContext, stream: str, subject: str, after: int, end: int, *, latest_only: bool) -> bool:
    """Is a message on `subject` with a sequence in (after, end] still to be delivered? With `latest_only`, one
    superseded by a later message on its own subject does not count (that later one is what is delivered)."""
    seq = after + 1
    while seq <= end:
        try:
            found = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return False
        if found.seq is None or found.seq > end:
            return False
        if not latest_only or found.subject is None:
            return True
        try:
            newest = await js.get_msg(stream, subject=found.subject)
        except nats.js.errors.NotFoundError:
            return True
        if newest.seq == found.seq:
            return True
        seq = found.seq + 1
    return False
