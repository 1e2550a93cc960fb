"""The frame cutter of the Firehose and the plain connections (direct publishes, ordered reader, plain puller):
NATS server protocol in, payloads (or, in full, subject, sid, reply subject, header block and payload) out, whatever
the read boundaries."""

import pytest

from chamber.common.bus.firehose import FrameParser, supported

PAYLOADS = [b'{"kind":"NodeTelemetryColumns"}', b"", b"MSG in a payload\r\nPING\r\n", b"x" * 5000]


def stream() -> bytes:
    out = b'INFO {"server_id":"x"}\r\n+OK\r\nPONG\r\n'
    for i, p in enumerate(PAYLOADS):
        if i == 1:
            header = b"NATS/1.0\r\nNats-Msg-Id: 7\r\n\r\n"
            out += b"HMSG ns.telemetry.n%d 1 %d %d\r\n%s%s\r\n" % (i, len(header), len(header) + len(p), header, p)
        else:
            out += b"MSG ns.telemetry.n%d 1 %d\r\n%s\r\n" % (i, len(p), p)
        if i == 2:
            out += b"PING\r\n-ERR 'Slow Consumer'\r\n"
    return out


def test_payloads_come_out_whole_and_in_order() -> None:
    parser, out = FrameParser(), list[bytes]()
    parser.feed(stream(), out)
    assert out == PAYLOADS
    assert (parser.pings, parser.pongs, parser.errors) == (1, 1, ["'Slow Consumer'"])


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 1000, 4096])
def test_any_read_boundaries_give_the_same_payloads(step: int) -> None:
    data = stream()
    parser, out = FrameParser(), list[bytes]()
    for i in range(0, len(data), step):
        parser.feed(data[i : i + step], out)
    assert out == PAYLOADS
    assert parser.pings == 1


def test_a_frame_with_a_reply_subject() -> None:
    parser, out = FrameParser(), list[bytes]()
    parser.feed(b"MSG ns.telemetry.a 1 _INBOX.x 3\r\nabc\r\n", out)
    assert out == [b"abc"]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 1000, 4096])
def test_full_frames_keep_the_subject_and_header_block(step: int) -> None:
    """`DirectAckPipeline` matches an ack to its publish by the subject, and reads a status (no responders) from
    the header block; the server's INFO is kept (what it allows)."""
    data = stream()
    parser, out = FrameParser(full=True), list[tuple[bytes, bytes, bytes, bytes, bytes]]()
    for i in range(0, len(data), step):
        parser.feed(data[i : i + step], out)
    assert [payload for *_, payload in out] == PAYLOADS
    assert [subject for subject, *_ in out] == [b"ns.telemetry.n%d" % i for i in range(len(PAYLOADS))]
    assert [header for _, _, _, header, _ in out] == [b"", b"NATS/1.0\r\nNats-Msg-Id: 7\r\n\r\n", b"", b""]
    assert parser.info == b'{"server_id":"x"}'
    parser.feed(b"MSG _INBOX.x.1 1 _INBOX.y 2\r\n{}\r\nHMSG _INBOX.x.2 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n", out)
    assert out[-2:] == [
        (b"_INBOX.x.1", b"1", b"_INBOX.y", b"", b"{}"),
        (b"_INBOX.x.2", b"1", b"", b"NATS/1.0 503\r\n\r\n", b""),
    ]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 1000, 4096])
def test_full_frames_keep_the_sid_and_the_reply_subject(step: int) -> None:
    """`OrderedReader` tells its consumer's deliveries from the API's answers by the sid, and reads the sequences
    from the reply subject."""
    data = (
        b"MSG _INBOX.api.1 1 5\r\nhello\r\n"
        b"HMSG $KV.b.j1 7 $JS.ACK.KV_b.c.1.42.3.1700000000.0 22 24\r\nNATS/1.0\r\nKV-Op: x\r\n\r\n{}\r\n"
        b"HMSG _INBOX.d 7 31 31\r\nNATS/1.0 100 Idle Heartbeat\r\n\r\n\r\n"
        b"MSG $KV.b.j2 7 $JS.ACK.KV_b.c.1.43.4.1700000000.0 2\r\n{}\r\n"
    )
    parser, out = FrameParser(full=True), list[tuple[bytes, bytes, bytes, bytes, bytes]]()
    for i in range(0, len(data), step):
        parser.feed(data[i : i + step], out)
    assert out == [
        (b"_INBOX.api.1", b"1", b"", b"", b"hello"),
        (b"$KV.b.j1", b"7", b"$JS.ACK.KV_b.c.1.42.3.1700000000.0", b"NATS/1.0\r\nKV-Op: x\r\n\r\n", b"{}"),
        (b"_INBOX.d", b"7", b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", b""),
        (b"$KV.b.j2", b"7", b"$JS.ACK.KV_b.c.1.43.4.1700000000.0", b"", b"{}"),
    ]


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("nats://127.0.0.1:4222", True),
        ("nats://u:p@h:4222", True),
        ("tls://h:4222", False),
        ("nats://a:4222,nats://b:4222", True),
        ("ws://h:80", False),
    ],
)
def test_which_servers_it_reads(url: str, ok: bool) -> None:
    assert supported(url) is ok
