"""Telemetry load for `chamber bench telemetry`: node batches from many distinct nodes, over real NATS.

Run as its own process (`python -m chamber.collector.loadgen flood|steady URL PREFIX NODES ...`), so its CPU does
not count against the aggregator it feeds. Each batch is what an NVML node agent sends for an 8-GPU H100 node
(`NodeTelemetryColumns`, as the agents publish it).

It writes NATS protocol `PUB` frames to a plain socket instead of calling nats-py: nats-py's `publish` costs tens
of microseconds a message, so one process could not offer the 60,000 node batches a second the aggregator is
measured at. The server still routes every frame to the aggregator's subscription as it would a client's.
- `flood`: `rounds` batches per node, as fast as the server takes them (it slows the writer down when the
  subscriber falls behind): throughput;
- `steady`: every node once per `interval` for `seconds`, spread evenly over the interval, each stamped with the
  time it is sent: what 12,500 agents do, for the sample-to-metric lag.
"""

import socket
import sys
import time
from urllib.parse import urlparse

import msgspec

from chamber.common.codec import encode
from chamber.common.contracts import GpuProcess, GpuSample, NodeTelemetry, to_columns

GPUS_PER_NODE = 8
STEADY_SLOT_S = 0.01
STAMP = 1234567890.0625
"""A sample time no real one equals, cut out of a pre-encoded batch and replaced by the send time."""
encode_float = msgspec.json.encode


def node_name(n: int) -> str:
    return f"node-{n:06d}"


def nvml_batch(node: str, at: float, interval_s: float = 1.0, gpus: int = GPUS_PER_NODE) -> NodeTelemetry:
    """Everything an NVML agent reads on an H100 node (pre-Ampere retired pages and GPM activity are absent)."""
    samples = [
        GpuSample(
            index=i, uuid=f"GPU-{node}-{i:02d}-4c1e-9d6a-3b7f2e8a", gpu_util=87.0 - i, mem_util=41.0,
            mem_used_mb=61_234.0, mem_total_mb=81_559.0, temperature_c=63.0, power_w=512.3 + i, power_limit_w=700.0,
            ecc_dbe_volatile=0, ecc_sbe_volatile=2, clock_event_reasons=0, ecc_dbe_aggregate=0, ecc_sbe_aggregate=14,
            remapped_rows_correctable=0, remapped_rows_uncorrectable=0, remapped_rows_pending=False,
            remapped_rows_failure=False, nvlink_replay_errors=0, nvlink_recovery_errors=0, nvlink_crc_errors=3,
            pcie_replay_count=1, processes=[GpuProcess(pid=4242 + i, used_memory_mb=61_000.0)], recovery_action=0,
        )
        for i in range(gpus)
    ]  # fmt: skip
    return NodeTelemetry(node=node, sampled_at=at, interval_s=interval_s, gpus=samples, source="nvml")


def frame(prefix: str, node: str, payload: bytes) -> bytes:
    return b"PUB %s.%s %d\r\n%s\r\n" % (prefix.encode(), node.encode(), len(payload), payload)


def connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 4222), timeout=60)
    sock.recv(4096)  # INFO
    sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"name":"chamber-loadgen"}\r\n')
    return sock


def finish(sock: socket.socket) -> None:
    """PING and wait for PONG: every frame before it has been processed by the server."""
    sock.sendall(b"PING\r\n")
    seen = b""
    while b"PONG" not in seen:
        chunk = sock.recv(4096)
        if not chunk:
            break
        seen = seen[-8:] + chunk
    sock.close()


def flood(url: str, prefix: str, nodes: int, rounds: int) -> None:
    now = time.time()
    batches = (to_columns(nvml_batch(node_name(n), now)) for n in range(nodes))
    chunk = b"".join(frame(prefix, b.node, encode(b)) for b in batches)
    sock = connect(url)
    for _ in range(rounds):
        sock.sendall(chunk)
    finish(sock)


def stamped(prefix: str, node: str, interval_s: float) -> tuple[bytes, bytes, bytes]:
    """A node's batch encoded once, cut around its sample time: (`PUB subject `, before, after)."""
    payload = encode(to_columns(nvml_batch(node, STAMP, interval_s)))
    before, after = payload.split(encode_float(STAMP))
    return b"PUB %s.%s " % (prefix.encode(), node.encode()), before, after


def steady(url: str, prefix: str, nodes: int, interval_s: float, seconds: float) -> None:
    """Each batch is encoded once and stamped with the time it is sent: encoding 12,500 batches a second anew would
    take this process more than its core, and the aggregator would be offered less than the fleet sends."""
    templates = [stamped(prefix, node_name(n), interval_s) for n in range(nodes)]
    sock = connect(url)
    slots = max(1, round(interval_s / STEADY_SLOT_S))
    start = time.time()
    sent = 0
    while time.time() - start < seconds:
        round_start = start + (sent // nodes) * interval_s
        for slot in range(slots):
            due = round_start + slot * interval_s / slots
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            first, last = slot * nodes // slots, (slot + 1) * nodes // slots
            at = encode_float(time.time())
            parts: list[bytes] = []
            for head, before, after in templates[first:last]:
                parts += (head, b"%d\r\n" % (len(before) + len(at) + len(after)), before, at, after, b"\r\n")
            sock.sendall(b"".join(parts))
        sent += nodes
    finish(sock)


def main(argv: list[str]) -> None:
    mode, url, prefix, nodes = argv[0], argv[1], argv[2], int(argv[3])
    if mode == "flood":
        flood(url, prefix, nodes, int(argv[4]))
    elif mode == "steady":
        steady(url, prefix, nodes, float(argv[4]), float(argv[5]))
    else:
        raise SystemExit(f"unknown mode {mode!r}: flood or steady")


if __name__ == "__main__":
    main(sys.argv[1:])
