"""The consumer reads a message's delivery count off its ack subject itself (nats-py's `metadata` costs more than
the rest of the check): it must agree with nats-py on every form of the subject; a reply that is no ack subject
counts as one delivery (nats-py would raise, and `PlainMsg` has no `metadata` to ask)."""

import pytest
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from chamber.common.bus.consumer import _deliveries, _redelivered, _stream_seq

TS = "1700000000000000000"


@pytest.mark.parametrize(
    "reply",
    [
        f"$JS.ACK.JOBS.scheduler.1.10.9.{TS}.0",  # v1, first delivery
        f"$JS.ACK.JOBS.scheduler.4.10.9.{TS}.3",  # v1, redelivered
        f"$JS.ACK._.ACCHASH.JOBS.scheduler.2.10.9.{TS}.0.RANDOM",  # v2, no domain
        f"$JS.ACK.hub.ACCHASH.JOBS.scheduler.7.10.9.{TS}.0.RANDOM",  # v2 with a domain
        f"$JS.ACK.hub.ACCHASH.JOBS.scheduler.5.10.9.{TS}.0",  # v2 without the trailing token
    ],
)
def test_the_count_is_nats_pys(reply: str) -> None:
    msg = Msg(None, subject="x", reply=reply)  # type: ignore[arg-type]
    assert _deliveries(msg) == msg.metadata.num_delivered
    assert _redelivered(msg) == (msg.metadata.num_delivered > 1)
    assert _stream_seq(msg) == msg.metadata.sequence.stream


@pytest.mark.parametrize("reply", ["", "_INBOX.abc", f"$JS.ACK.JOBS.scheduler.x.10.9.{TS}.0"])
def test_a_message_without_an_ack_subject_counts_as_delivered_once(reply: str) -> None:
    """Pull consumers' deliveries always carry one; were one not to, the consumer must not crash on the count (a
    raise there ended its loop), and nats-py's `metadata` refuses such a message."""
    msg = Msg(None, subject="x", reply=reply)  # type: ignore[arg-type]
    assert _deliveries(msg) == 1
    assert not _redelivered(msg)
    assert _stream_seq(msg) == (10 if reply.startswith("$JS.ACK.") else 0)
    if not reply.startswith("$JS.ACK."):
        with pytest.raises(NotJSMessageError):
            _ = msg.metadata
