"""Reading a stream to its end: start-up state (last value per subject, the job records, a time window) and the
replay of messages a crashed consumer had received but not acknowledged.

One helper instead of a loop in every caller: an ephemeral, unacknowledged pull consumer from the chosen start,
fetched in batches until the message that had nothing pending after it (or, for a range, the last sequence
wanted). No client-library internals are used, only the documented consumer API.
"""

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from chamber.common.bus.errors import BusError


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
    BY_START_TIME; `first_seq` with BY_START_SEQUENCE) to the end of the stream, or to `last_seq`."""
    try:
        info = await js.stream_info(stream)
    except nats.errors.Error as exc:
        raise BusError(f"cannot read stream {stream}: {exc}") from exc
    if info.state.messages == 0 or (last_seq is not None and first_seq is not None and first_seq > last_seq):
        return
    config = ConsumerConfig(deliver_policy=deliver, ack_policy=AckPolicy.NONE, inactive_threshold=30.0)
    if since is not None:
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = datetime.fromtimestamp(max(since, 0.0), UTC)
    if first_seq is not None:
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = first_seq
    try:
        psub = await js.pull_subscribe(subject, stream=stream, config=config)
    except nats.errors.Error as exc:
        raise BusError(f"cannot read {subject} from {stream}: {exc}") from exc
    try:
        while True:
            try:
                msgs = await psub.fetch(batch, timeout=idle_s)
            except (nats.errors.TimeoutError, TimeoutError):
                return
            for msg in msgs:
                meta = msg.metadata
                if last_seq is not None and meta.sequence.stream > last_seq:
                    return
                yield msg
                if meta.num_pending == 0 or (last_seq is not None and meta.sequence.stream == last_seq):
                    return
    finally:
        await psub.unsubscribe()
