"""The bus across a NATS restart, on an embedded nats-server of the test's own (it is SIGKILLed and started again
on the same port with the same store, as the chaos run does)."""

from pathlib import Path

import pytest

from chamber.cli.infra import embedded_nats
from chamber.common.bus import Bus, Consumer
from chamber.common.bus.puller import Puller
from chamber.common.codec import Decoder, encode
from chamber.common.contracts import JobCancelRequested, JobEvent
from chamber.common.subjects import JOBS, Names
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_after_a_nats_restart_the_replay_covers_what_a_crashed_consumer_received(tmp_path: Path) -> None:
    """A consumer's first `add_consumer` answer after the server reloaded it is the state at load time: after a
    restart it said "delivered up to N" while much more had been delivered since. A consumer that took that as
    the end of its replay missed the messages a SIGKILLed instance had received (they came 30 s later, at the
    ack wait). The replay must cover them."""
    server = embedded_nats(tmp_path)
    server.start()
    try:
        bus = await Bus.connect(server.url, Names("restart"), "test")
        await bus.ensure_streams()
        stream = bus.names.stream(JOBS)
        replayed: list[str] = []

        async def one(event: JobCancelRequested) -> None:
            pass

        async def again(events: list[JobCancelRequested]) -> None:
            replayed.extend(e.job_id for e in events)

        def consumer() -> Consumer[JobCancelRequested]:
            return bus.consumer(
                stream=JOBS, durable="d", filter_subjects=[bus.names.subject("jobs.>")], decoder=Decoder(JobEvent),
                handler=one, recheck_handler=again, batch=64,
            )  # fmt: skip

        async def publish(*jobs: str) -> None:
            for job in jobs:
                await bus.js.publish(bus.names.job_cancel(job), encode(JobCancelRequested(job_id=job, requested_at=1)))

        first = consumer()
        await first.start()
        await publish(*[f"before-{i}" for i in range(5)])
        await eventually(lambda: first.processed == 5, what="handled and acked before the restart")
        await first.stop()

        server.kill()
        server.start()

        async def jetstream_back() -> bool:
            try:
                await bus.js.stream_info(stream)
            except Exception:
                return False
            return True

        await eventually(jetstream_back, within=20, what="JetStream answers again after the restart")

        await publish(*[f"after-{i}" for i in range(5)])
        crashed = Puller(bus.nc, stream, "d", batch=64)
        await crashed.start()
        got: list[object] = []
        while len(got) < 5:
            got += await crashed.fetch(timeout_s=2.0)
        await crashed.stop()  # received after the restart, never acked: the instance died

        second = consumer()
        await second.start()
        assert sorted(replayed) == [f"after-{i}" for i in range(5)]
        await second.stop()
        await bus.close()
    finally:
        server.stop()
