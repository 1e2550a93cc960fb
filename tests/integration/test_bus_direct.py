"""JetStream publishes over the bus's own plain connection (`DirectAckPipeline`), on a real server: what differs
from nats-py's path. The results themselves (acks in order, duplicates, compare-and-set refusals, subjects no
stream stores, batches of hundreds) are `test_bus.py`'s, which runs on this path (a plain `nats://` URL)."""

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from nats.js.api import PubAck

from chamber.cli.infra import embedded_nats
from chamber.common.bus import Bus, BusError, PublishError
from chamber.common.bus.direct import DirectAckPipeline, direct_supported
from chamber.common.bus.pipeline import AckPipeline
from chamber.common.bus.plain import PlainProtocol
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def test_only_a_single_plain_server_is_published_to_directly() -> None:
    assert direct_supported("nats://127.0.0.1:4222")
    assert direct_supported("nats://user:secret@nats.example:4222")
    assert direct_supported("nats://token@nats.example")
    assert not direct_supported("tls://nats.example:4222")
    assert not direct_supported("nats://a:4222,nats://b:4222")
    assert not direct_supported("ws://nats.example:8080")


async def test_a_bad_message_is_refused_alone(bus: Bus) -> None:
    """A subject or a header that would break the protocol's framing, or a payload over the server's limit, is
    refused for that message only: the others of its batch are stored, and the connection is kept."""
    ok = bus.names.job_cancel("fine")
    results = await bus.publish_many(
        [
            (ok, b"{}", None),
            (bus.names.subject("has space"), b"{}", None),
            (ok, b"{}", {"Nats-Msg-Id": "a\r\nInjected: yes"}),
            (ok, b"x" * (8 * 1024 * 1024), None),
            (ok, b"{}", {"Nats-Msg-Id": "fine-2"}),
        ]
    )
    first, spaced, injected, huge, last = results
    assert not isinstance(first, BusError)
    assert isinstance(spaced, PublishError)
    assert "invalid subject" in str(spaced)
    assert isinstance(injected, PublishError)
    assert "invalid headers" in str(injected)
    assert isinstance(huge, PublishError)
    assert "the server takes" in str(huge)
    assert not isinstance(last, BusError)
    assert last.seq == first.seq + 1


async def _replies_held_back(
    pipeline: DirectAckPipeline, bus: Bus, tag: str
) -> tuple[list[tuple[str, bytes, None]], PlainProtocol]:
    """Three messages published through `pipeline` (acked), then its connection's replies held back (nothing the
    server sends is read until `first.transport.resume_reading()`): as a half-open connection, or a slow server."""
    items = [(bus.names.job_cancel(f"{tag}{i}"), b"{}", None) for i in range(3)]
    assert not any(isinstance(r, BusError) for r in await pipeline.publish_many(items))
    first = pipeline._protocol
    assert first is not None
    assert first.transport is not None
    first.transport.pause_reading()
    return items, first


async def test_a_batch_whose_acks_do_not_come_times_out_and_a_connection_that_answers_nothing_is_replaced(
    bus: Bus,
) -> None:
    """Half-open: nothing the server sends arrives (neither the acks nor the PONG to the probe), so the connection
    is given up and the next batch connects anew."""
    pipeline = DirectAckPipeline(Settings.from_env().nats_url, AckPipeline(bus.nc))
    pipeline.probe_s = 0.2
    try:
        items, first = await _replies_held_back(pipeline, bus, "j")
        late = await pipeline.publish_many(items, timeout_s=0.2)
        assert all(isinstance(r, PublishError) and "within 0.2 s" in str(r) for r in late)
        assert not pipeline._waiting, "a batch that gave up leaves nothing behind"
        again = await pipeline.publish_many(items)
        assert not any(isinstance(r, BusError) for r in again)
        assert pipeline._protocol is not first, "a connection that answers nothing is not used again"
        assert first.closed
    finally:
        await pipeline.close()


async def test_a_batch_that_comes_while_a_connection_is_probed_waits_and_goes_on_the_next_one(bus: Bus) -> None:
    """Half-open: a batch started while the late one probes the connection is not written into it (it would fail
    once the probe gives the connection up): it waits for the answer and goes on a new connection."""
    pipeline = DirectAckPipeline(Settings.from_env().nats_url, AckPipeline(bus.nc))
    pipeline.probe_s = 0.5
    try:
        items, first = await _replies_held_back(pipeline, bus, "h")
        late = asyncio.create_task(pipeline.publish_many(items[:1], timeout_s=0.2))
        await asyncio.sleep(0.35)  # timed out at 0.2 s, probing until 0.7 s
        meanwhile = await pipeline.publish_many(items[1:], timeout_s=5.0)
        assert not any(isinstance(r, BusError) for r in meanwhile), meanwhile
        assert isinstance((await late)[0], PublishError)
        assert pipeline._protocol is not first
    finally:
        await pipeline.close()


async def test_a_late_batch_fails_no_other_batch_on_a_connection_that_still_answers(bus: Bus) -> None:
    """Acks late (the replies held back for a while, as from a busy server): the batch with the short timeout fails
    alone; the connection answers the probe's PING once replies flow again, so it is kept, and the batch waiting
    on it with a longer timeout gets its acks (before, the late batch gave the connection up and failed it too)."""
    pipeline = DirectAckPipeline(Settings.from_env().nats_url, AckPipeline(bus.nc))
    try:
        items, first = await _replies_held_back(pipeline, bus, "k")
        short = asyncio.create_task(pipeline.publish_many(items[:1], timeout_s=0.2))
        patient = asyncio.create_task(pipeline.publish_many(items[1:], timeout_s=5.0))
        await asyncio.sleep(0.5)  # the short batch timed out, and probes the connection (PROBE_S: 2 s)
        assert first.transport is not None
        first.transport.resume_reading()
        late, kept = await short, await patient
        assert isinstance(late[0], PublishError)
        assert "within 0.2 s" in str(late[0])
        assert not any(isinstance(r, BusError) for r in kept), kept
        assert pipeline._protocol is first, "a connection that answers is kept"
        assert not first.closed
        assert not any(isinstance(r, BusError) for r in await pipeline.publish_many(items))
    finally:
        await pipeline.close()


async def test_a_server_that_asks_for_tls_gets_the_publishes_through_nats_py(bus: Bus) -> None:
    """Where the server needs what the direct connection does not do, nats-py's path (`AckPipeline`, given as
    the fallback) takes every publish from then on."""
    taken: list[int] = []

    class Fallback(AckPipeline):
        async def publish_many(
            self, items: Sequence[tuple[str, bytes, dict[str, str] | None]], *, timeout_s: float = 5.0
        ) -> list[PubAck | BusError]:
            taken.append(len(items))
            return await super().publish_many(items, timeout_s=timeout_s)

    pipeline = DirectAckPipeline(Settings.from_env().nats_url, Fallback(bus.nc))
    pipeline._unsupported = True  # as `_connect` finds when INFO says tls_required
    try:
        results = await pipeline.publish_many([(bus.names.job_cancel("t"), b"{}", None)])
        assert not isinstance(results[0], BusError)
        assert taken == [1]
    finally:
        await pipeline.close()


async def test_publishes_wait_out_a_nats_restart_within_their_timeout(tmp_path: Path) -> None:
    """While the server is away a batch waits for it (as nats-py buffers publishes while it reconnects); one
    waiting on acks when the connection is lost fails at once, not at its timeout."""
    server = embedded_nats(tmp_path)
    server.start()
    try:
        bus = await Bus.connect(server.url, Names("direct"), "test")
        pipeline = bus._pipeline
        assert isinstance(pipeline, DirectAckPipeline)
        await bus.ensure_streams()
        subject = bus.names.job_cancel("r")
        assert not isinstance((await bus.publish_many([(subject, b"{}", None)]))[0], BusError)

        server.kill()
        await eventually(lambda: pipeline._protocol is None, within=10, what="the connection's loss noticed")
        waiting = asyncio.ensure_future(pipeline.publish_many([(subject, b"{}", None)], timeout_s=30.0))
        await asyncio.sleep(1.0)  # tries to reach the server meanwhile
        assert not waiting.done()
        await asyncio.get_running_loop().run_in_executor(None, server.start)
        (result,) = await waiting
        assert not isinstance(result, BusError), result

        pipeline._on_reply = lambda subject, header, payload: None  # type: ignore[method-assign]  # acks unheard
        batch = asyncio.ensure_future(pipeline.publish_many([(subject, b"{}", None)] * 50, timeout_s=30.0))
        await eventually(lambda: bool(pipeline._waiting), within=10, what="the batch in flight")
        loop = asyncio.get_running_loop()
        started = loop.time()
        server.kill()
        outcome = await batch
        assert loop.time() - started < 10.0, "failed when the connection went, not at the timeout"
        assert all(isinstance(r, PublishError) and "connection lost" in str(r) for r in outcome), outcome
        del pipeline._on_reply
        server.start()
        await eventually(lambda: _stored(bus, subject), within=20, what="publishes go through after the restart")
        await bus.close()
    finally:
        server.stop()


async def _stored(bus: Bus, subject: str) -> bool:
    (result,) = await bus.publish_many([(subject, b"{}", None)])
    return not isinstance(result, BusError)
