"""How `OrderedReader` reads what its connection brings, frame by frame, without a server: deliveries in order,
the sequences from their reply subjects, and every sign of a lost message (a gap in the consumer sequence, a
heartbeat that counts more than was read, a status that the consumer is gone) ending the consumer, to be made
anew after the last message handed over. The same against a real server: `tests/integration/test_bus_ordered.py`."""

import asyncio

import pytest

from chamber.common.bus.errors import BusError
from chamber.common.bus.ordered import OrderedReader, ack_sequences

SID = b"5"


def ack(stream_seq: int, consumer_seq: int) -> bytes:
    return b"$JS.ACK.KV_b.cons.1.%d.%d.1700000000000000000.0" % (stream_seq, consumer_seq)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (b"$JS.ACK.KV_b.cons.1.42.7.1700000000000000000.3", (42, 7)),
        (b"$JS.ACK.hub.ACCHASH.KV_b.cons.1.42.7.1700000000000000000.3", (42, 7)),
        (b"$JS.ACK.hub.ACCHASH.KV_b.cons.1.42.7.1700000000000000000.3.tok", (42, 7)),
        (b"$JS.ACK.KV_b.cons.1.x.7.1700000000000000000.3", None),
        (b"$JS.ACK.KV_b.cons.1.42", None),
        (b"_INBOX.abc", None),
        (b"", None),
    ],
)
def test_sequences_are_read_from_both_forms_of_the_reply_subject(reply: bytes, expected: object) -> None:
    assert ack_sequences(reply) == expected


class Wire:
    """What the reader writes back to the server."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


async def reader_on() -> tuple[OrderedReader, list[tuple[bytes, int]], Wire]:
    """A reader (never started: no connection) whose consumer's subscription is `SID`."""
    seen: list[tuple[bytes, int]] = []
    reader = OrderedReader("nats://127.0.0.1:4222", "KV_b", "$KV.b.>", lambda s, h, p, q: seen.append((p, q)))
    reader._sid = SID
    return reader, seen, Wire()


def feed(reader: OrderedReader, wire: Wire, *frames: tuple[bytes, bytes, bytes, bytes, bytes]) -> None:
    reader._take(wire, list(frames))  # type: ignore[arg-type]  # only `write` is used


async def test_deliveries_are_handed_over_in_order_with_their_stream_sequence() -> None:
    reader, seen, wire = await reader_on()
    feed(reader, wire, (b"$KV.b.j1", SID, ack(10, 1), b"", b"a"), (b"$KV.b.j2", SID, ack(12, 2), b"", b"b"))
    assert seen == [(b"a", 10), (b"b", 12)]
    assert reader.last_sequence == 12
    assert not reader._reset.is_set()


async def test_a_gap_in_the_consumer_sequence_ends_the_consumer_after_the_last_message_read() -> None:
    reader, seen, wire = await reader_on()
    feed(
        reader, wire,
        (b"$KV.b.j1", SID, ack(10, 1), b"", b"a"),
        (b"$KV.b.j3", SID, ack(14, 3), b"", b"c"),  # 2 was lost on the way
        (b"$KV.b.j4", SID, ack(15, 4), b"", b"d"),
    )  # fmt: skip
    assert seen == [(b"a", 10)], "nothing after the gap is handed over: the new consumer starts at 11"
    assert reader.last_sequence == 10
    assert reader._reset.is_set()
    assert reader._sid == b""


async def test_a_heartbeat_that_counts_more_than_was_read_ends_the_consumer() -> None:
    reader, _, wire = await reader_on()
    feed(reader, wire, (b"$KV.b.j1", SID, ack(10, 1), b"", b"a"))
    feed(reader, wire, (b"_INBOX.d", SID, b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1\r\n\r\n", b""))
    assert not reader._reset.is_set(), "a heartbeat that agrees changes nothing"
    feed(reader, wire, (b"_INBOX.d", SID, b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 2\r\n\r\n", b""))
    assert reader._reset.is_set()


async def test_a_status_that_the_consumer_is_gone_ends_it() -> None:
    reader, _, wire = await reader_on()
    feed(reader, wire, (b"_INBOX.d", SID, b"", b"NATS/1.0 409 Consumer Deleted\r\n\r\n", b""))
    assert reader._reset.is_set()


async def test_flow_control_and_a_stall_are_answered() -> None:
    reader, _, wire = await reader_on()
    feed(
        reader, wire,
        (b"_INBOX.d", SID, b"$JS.FC.KV_b.x.1", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
        (b"_INBOX.d", SID, b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Consumer-Stalled: $JS.FC.KV_b.y.2\r\n\r\n", b""),
    )  # fmt: skip
    assert wire.written == [b"PUB $JS.FC.KV_b.x.1 0\r\n\r\n", b"PUB $JS.FC.KV_b.y.2 0\r\n\r\n"]
    assert not reader._reset.is_set()


async def test_deliveries_of_a_consumer_given_up_are_dropped_and_api_answers_still_read() -> None:
    reader, seen, wire = await reader_on()
    answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    reader._requests[b"_INBOX.api.1"] = answer
    feed(
        reader, wire,
        (b"$KV.b.j1", b"4", ack(10, 1), b"", b"old"),  # an earlier consumer's subscription
        (b"_INBOX.api.1", b"1", b"", b"", b'{"name":"c2"}'),
    )  # fmt: skip
    assert seen == []
    assert answer.result() == b'{"name":"c2"}'


async def test_a_handler_that_raises_does_not_stop_the_reading() -> None:
    seen: list[bytes] = []

    def handler(subject: bytes, header: bytes, payload: bytes, sequence: int) -> None:
        if payload == b"bad":
            raise ValueError("a follower's bug")
        seen.append(payload)

    reader = OrderedReader("nats://127.0.0.1:4222", "KV_b", "$KV.b.>", handler)
    reader._sid = SID
    feed(reader, Wire(), (b"$KV.b.j1", SID, ack(1, 1), b"", b"bad"), (b"$KV.b.j2", SID, ack(2, 2), b"", b"ok"))
    assert seen == [b"ok"]
    assert reader.last_sequence == 2


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"not json", "unreadable answer"),
        (b'"a string"', "unreadable answer"),
        (b'{"error": {"code": 404, "description": "stream not found"}}', "stream not found"),
        (b'{"error": "odd"}', "odd"),
    ],
)
async def test_an_api_answer_that_makes_no_consumer_is_a_clear_error(answer: bytes, why: str) -> None:
    """What the JetStream API answers to the consumer's creation, garbage included, ends in a `BusError` saying
    why (the keeping loop logs it and tries again), never in an exception that would end the follow."""
    reader, _, wire = await reader_on()
    making = asyncio.ensure_future(reader._subscribe(wire))  # type: ignore[arg-type]  # only `write` is used
    await asyncio.sleep(0)
    (token,) = reader._requests
    feed(reader, wire, (token, b"1", b"", b"", answer))
    with pytest.raises(BusError, match=why):
        await making
    assert reader._sid == b"", "no consumer's deliveries are read"
