"""The Firehose on a real NATS server: every payload, whole and in order, in bounded slices; it comes back after
its connection is cut."""

import asyncio

import pytest

from chamber.common.bus import Bus
from chamber.common.bus.firehose import Firehose
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_payloads_arrive_whole_in_order_and_in_bounded_slices(bus: Bus, settings: Settings) -> None:
    slices: list[list[bytes]] = []
    firehose = Firehose(settings.nats_url, bus.names.subject("telemetry.>"), slices.append, slice_msgs=100)
    await firehose.start()
    try:
        sent = [b"%d:" % i + b"x" * (i % 3000) for i in range(2_000)]
        sent[7] = b"MSG fake 1 3\r\nabc\r\n"
        for i, payload in enumerate(sent):
            await bus.nc.publish(bus.names.telemetry(f"node-{i % 50}"), payload)
        await bus.nc.publish(bus.names.subject("inventory.node-1"), b"not on the subject")
        await bus.nc.flush()

        async def all_in() -> bool:
            return sum(map(len, slices)) >= len(sent)

        await eventually(all_in, what="every payload delivered")
        assert [p for s in slices for p in s] == sent
        assert max(map(len, slices)) <= 100
        assert (firehose.received, firehose.dropped) == (len(sent), 0)
    finally:
        await firehose.close()


async def test_it_reconnects_after_the_connection_is_cut(bus: Bus, settings: Settings) -> None:
    got: list[bytes] = []
    firehose = Firehose(settings.nats_url, bus.names.subject("telemetry.>"), got.extend, ping_interval_s=0.05)
    await firehose.start()
    try:
        await asyncio.sleep(0.3)
        assert firehose._protocol is not None, "a server that answers its PINGs keeps the connection"
        assert firehose._protocol.parser.pongs >= 3
        protocol = firehose._protocol
        assert protocol is not None
        assert protocol.transport is not None
        protocol.transport.abort()

        async def back() -> bool:
            await bus.nc.publish(bus.names.telemetry("node-1"), b"after")
            await bus.nc.flush()
            await asyncio.sleep(0.05)
            return b"after" in got

        await eventually(back, what="payloads flow again after a reconnect")
    finally:
        await firehose.close()


def test_it_runs_on_uvloop_as_the_services_do(settings: Settings) -> None:
    """Services run on uvloop (`chamber.common.runtime`), whose transports are not asyncio's classes."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> list[bytes]:
        got: list[bytes] = []
        bus = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
        firehose = Firehose(settings.nats_url, bus.names.subject("telemetry.>"), got.extend)
        await firehose.start()
        try:
            for i in range(100):
                await bus.nc.publish(bus.names.telemetry("node-1"), b"%d" % i)
            await bus.nc.flush()
            for _ in range(100):
                if len(got) == 100:
                    break
                await asyncio.sleep(0.02)
        finally:
            await firehose.close()
            await bus.close()
        return got

    assert uvloop.run(scenario()) == [b"%d" % i for i in range(100)]
