"""`OrderedReader` on a real server: a stream followed in order, once each, through what goes wrong (a cut
connection, a consumer deleted under it, a burst that needs flow control), leaving no consumer behind. Its
reactions to each frame are `tests/unit/test_ordered_reader_frames.py`'s; the job-record follows on it are
`test_jobstore.py`'s, and through a NATS restart `test_bus_restart.py`'s."""

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.js.api import StreamConfig

from chamber.common.bus import Bus, BusError
from chamber.common.bus.ordered import OrderedReader
from tests.support.services import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(bus: Bus) -> AsyncIterator[str]:
    name = f"ORDERED_{secrets.token_hex(4).upper()}"
    await bus.js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"]))
    yield name
    await bus.js.delete_stream(name)


async def publish(bus: Bus, stream: str, first: int, count: int, size: int = 40) -> None:
    results = await bus.publish_many(
        [(f"{stream}.k{i % 7}", b"%d:" % i + b"x" * size, None) for i in range(first, first + count)]
    )
    assert not any(isinstance(r, BusError) for r in results)


def reader(bus: Bus, stream: str, seen: list[int], heartbeat_s: float = 1.0) -> OrderedReader:
    assert bus.plain_url is not None

    def on_message(subject: bytes, header: bytes, payload: bytes, sequence: int) -> None:
        seen.append(int(payload.split(b":", 1)[0]))

    return OrderedReader(bus.plain_url, stream, f"{stream}.>", on_message, start_seq=1, heartbeat_s=heartbeat_s)


async def consumers(bus: Bus, stream: str) -> list[str]:
    for _ in range(50):
        try:
            return [c.name for c in await bus.js.consumers_info(stream)]
        except AttributeError:  # nats-py cannot read a list in which the server shows a consumer being deleted
            await asyncio.sleep(0.05)
    raise AssertionError(f"the consumers of {stream} could not be listed")


async def test_a_cut_connection_resumes_after_the_last_message_read_and_deletes_the_consumer_given_up(
    bus: Bus, stream: str
) -> None:
    seen: list[int] = []
    follow = reader(bus, stream, seen)
    await follow.start()
    await publish(bus, stream, 0, 200)
    await eventually(lambda: len(seen) == 200)
    (before,) = await consumers(bus, stream)
    assert follow._protocol is not None
    assert follow._protocol.transport is not None
    follow._protocol.transport.abort()  # as a dropped TCP connection
    await publish(bus, stream, 200, 300)  # written while it is away
    await eventually(lambda: len(seen) == 500, what="every message, the ones written while away too")
    assert seen == list(range(500)), "in order, none twice"
    assert follow.resets == 1
    await eventually(lambda: consumers(bus, stream), what="a consumer again")
    assert before not in await consumers(bus, stream), "the consumer given up is deleted, not left to push to nobody"
    await follow.stop()

    async def none_left() -> bool:
        return not await consumers(bus, stream)

    await eventually(none_left, what="no consumer left after stop")


async def test_a_consumer_deleted_under_it_is_made_anew_once_its_heartbeats_stop(bus: Bus, stream: str) -> None:
    seen: list[int] = []
    follow = reader(bus, stream, seen, heartbeat_s=0.2)
    await follow.start()
    await publish(bus, stream, 0, 10)
    await eventually(lambda: len(seen) == 10)
    (name,) = await consumers(bus, stream)
    await bus.js.delete_consumer(stream, name)
    await publish(bus, stream, 10, 10)
    await eventually(lambda: len(seen) == 20, within=5.0, what="the writes after the delete")
    assert seen == list(range(20))
    assert follow.resets >= 1
    await follow.stop()


async def test_a_burst_to_a_slow_reader_goes_through_flow_control_without_a_loss(bus: Bus, stream: str) -> None:
    seen: list[int] = []
    flow_controls = 0
    follow = reader(bus, stream, seen)
    take = follow._take

    def counting(protocol: Any, frames: list[tuple[bytes, bytes, bytes, bytes, bytes]]) -> None:
        nonlocal flow_controls
        flow_controls += sum(1 for frame in frames if frame[2].startswith(b"$JS.FC."))
        time.sleep(0.002)  # a slow follower: what it has not read yet waits in the socket and the server
        take(protocol, frames)

    follow._take = counting  # type: ignore[method-assign]
    await publish(bus, stream, 0, 3000, size=4000)
    await follow.start()
    await eventually(lambda: len(seen) == 3000, within=30.0, what="the whole burst")
    assert seen == list(range(3000))
    assert flow_controls > 0, "the server asked for flow control, and was answered (else it would have stalled)"
    assert follow.resets == 0
    await follow.stop()


async def test_a_stream_that_does_not_exist_is_a_clear_error(bus: Bus) -> None:
    follow = reader(bus, "NO_SUCH_STREAM", [])
    with pytest.raises(BusError, match="stream not found"):
        await follow.start()
