"""The Firehose's frame cutter: NATS server protocol in, payloads out, whatever the read boundaries."""

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
