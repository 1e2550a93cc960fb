"""A consumer that remembers what it handled (`remember`) acks a message delivered again after it was handled (its
ack lost in a NATS restart, or its ack wait passed while the service was busy) without handling it a second time;
one that failed is handled when it comes again; without `remember`, as before, every delivery is handled."""

from dataclasses import dataclass, field

import pytest

from chamber.common.bus.consumer import Consumer
from chamber.common.codec import Decoder, encode
from chamber.common.contracts import JobCancelRequested

TS = "1700000000000000000"


@dataclass
class Delivery:
    """A pulled message as the consumer sees it (the fields and settlements it uses)."""

    seq: int
    deliveries: int = 1
    settled: list[str] = field(default_factory=list)
    subject: str = "telemetry.n1"
    reply: str = ""
    data: bytes = b""

    def __post_init__(self) -> None:
        self.reply = f"$JS.ACK.TELEMETRY.health.{self.deliveries}.{self.seq}.{self.seq}.{TS}.0"
        self.data = encode(JobCancelRequested(job_id=f"j{self.seq}", requested_at=float(self.seq)))

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.settled.append("nak")

    async def term(self) -> None:
        self.settled.append("term")


def consumer(handled: list[str], remember: int, fail: set[str], batch: bool) -> Consumer[JobCancelRequested]:
    async def handle(event: JobCancelRequested) -> None:
        if event.job_id in fail:
            fail.discard(event.job_id)
            raise RuntimeError("the handler failed once")
        handled.append(event.job_id)

    async def handle_batch(events: list[JobCancelRequested]) -> None:
        for event in events:
            await handle(event)

    return Consumer(
        bus=None,  # type: ignore[arg-type]  # (nothing here reaches the bus: no garbage, no dead letters)
        stream="TELEMETRY", durable="health", filter_subjects=["telemetry.>"], decoder=Decoder(JobCancelRequested),
        handler=handle, batch_handler=handle_batch if batch else None, batch=64, ack_wait_s=30.0, max_attempts=10,
        remember=remember,
    )  # fmt: skip


@pytest.mark.parametrize("batch", [False, True])
async def test_a_message_delivered_again_after_it_was_handled_is_acked_not_handled(batch: bool) -> None:
    handled: list[str] = []
    c = consumer(handled, remember=1_000, fail={"j3"}, batch=batch)
    await c._take([Delivery(1), Delivery(2)])
    await c._take([Delivery(3)])  # fails: nak'd, comes again
    again = [Delivery(1, deliveries=2), Delivery(3, deliveries=2), Delivery(2, deliveries=3), Delivery(4)]
    await c._take(list(again))
    assert handled == ["j1", "j2", "j3", "j4"], "each handled once; the one that failed, when it came again"
    assert [d.settled for d in again] == [["ack"], ["ack"], ["ack"], ["ack"]]
    assert c.duplicates == 2


async def test_without_remember_every_delivery_is_handled() -> None:
    handled: list[str] = []
    c = consumer(handled, remember=0, fail=set(), batch=False)
    await c._take([Delivery(1)])
    await c._take([Delivery(1, deliveries=2)])
    assert handled == ["j1", "j1"]
    assert c.duplicates == 0
