"""On a clustered NATS, every stream and KV bucket Chamber makes keeps `CHAMBER_NATS_REPLICAS` copies (the Helm
chart sets 3 with `nats.replicas: 3`): with one copy, losing the one server that held the JOBS stream or the jobs
KV lost them, however many servers ran. Streams and buckets made before the cluster grew are scaled up at start.
Runs a real three-server JetStream cluster on this machine."""

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from chamber.cli.infra import _nats_binary, free_port, nats_answers
from chamber.common.bus import Bus
from chamber.common.lease import Lease
from chamber.common.subjects import JOBS_BUCKET, LEASES_BUCKET, STREAMS, Names

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[str]]:
    """Three nats-servers with JetStream, routed to each other; their client URLs."""
    clients, routes = [free_port() for _ in range(3)], [free_port() for _ in range(3)]
    procs = []
    for i in range(3):
        conf = tmp_path / f"n{i}.conf"
        route_urls = ", ".join(f"nats://127.0.0.1:{p}" for p in routes)
        conf.write_text(
            f'server_name: n{i}\nlisten: 127.0.0.1:{clients[i]}\njetstream {{ store_dir: "{tmp_path / f"js{i}"}" }}\n'
            f"cluster {{ name: c, listen: 127.0.0.1:{routes[i]}, routes: [{route_urls}] }}\n"
        )
        procs.append(subprocess.Popen([_nats_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))  # fmt: skip
    urls = [f"nats://127.0.0.1:{p}" for p in clients]
    try:
        yield urls
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


async def _connected(urls: list[str], replicas: int) -> Bus:
    for _ in range(200):
        if all(nats_answers(u) for u in urls):
            break
        await asyncio.sleep(0.1)
    bus = await Bus.connect(urls[0], Names("replicas"), "test", replicas=replicas)
    for _ in range(150):  # JetStream's meta group elects a leader
        try:
            await bus.js.account_info()
            return bus
        except Exception:  # not ready yet, whatever nats-py raises
            await asyncio.sleep(0.2)
    raise AssertionError("the JetStream cluster did not form")


async def test_streams_and_buckets_keep_three_copies_and_older_ones_are_scaled(cluster: list[str]) -> None:
    first = await _connected(cluster, replicas=1)  # as an install made before the cluster grew
    await first.ensure_streams()
    await first.key_value(JOBS_BUCKET)
    await first.close()

    bus = await _connected(cluster, replicas=3)
    try:
        await bus.ensure_streams()
        for spec in STREAMS:
            assert (await bus.js.stream_info(bus.names.stream(spec))).config.num_replicas == 3, spec
        await bus.key_value(JOBS_BUCKET)
        jobs = await bus.js.stream_info(f"KV_{bus.names.bucket(JOBS_BUCKET)}")
        assert jobs.config.num_replicas == 3, "scaled from one copy"
        await Lease.open(bus, "scheduler", "me", ttl_s=5.0)
        leases = await bus.js.stream_info(f"KV_{bus.names.bucket(LEASES_BUCKET)}")
        assert leases.config.num_replicas == 3
    finally:
        await bus.close()
