"""Shared fixtures: real servers for the session, and a unique namespace per test (streams, KV, Redis keys)."""

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import nats
import nats.js.errors
import pytest
import redis.asyncio as aioredis

from chamber.common.settings import Settings
from chamber.common.subjects import STREAMS, Names
from tests.support.servers import Servers, find_servers


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    with find_servers() as found:
        yield found


@pytest.fixture
def namespace() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings(servers: Servers, namespace: str) -> Settings:
    return Settings(
        nats_url=servers.nats_url,
        redis_url=servers.redis_url,
        namespace=namespace,
        fleet_nodes=4,
        gpus_per_node=8,
        telemetry_interval_s=0.5,
        inventory_interval_s=5.0,
        schedule_interval_s=0.2,
        metrics_port=0,
    )


@pytest.fixture
async def cleanup(settings: Settings) -> AsyncIterator[None]:
    """Remove the test's streams, KV buckets and Redis keys afterwards."""
    yield
    names = Names(settings.namespace)
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    for spec in STREAMS:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(names.stream(spec))
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_key_value(names.bucket("jobs"))
    await nc.close()
    client = aioredis.Redis.from_url(settings.redis_url)
    keys = [k async for k in client.scan_iter(match=f"{names.redis_prefix()}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()
