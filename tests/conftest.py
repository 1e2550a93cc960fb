"""Shared fixtures: real servers for the session, and a unique namespace per test (streams, KV, Redis keys)."""

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from chamber.common.bus import Bus
from chamber.common.cleanup import delete_namespace
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from tests.support.servers import Servers, find_servers

ADMIN_TOKEN = "test-admin-token"


def pytest_sessionstart(session: pytest.Session) -> None:
    """`make pytest-compiled` runs the tests on the compiled core: make sure that is the core they import."""
    expected = os.environ.get("CHAMBER_EXPECT_CORE")
    if expected:
        from chamber.scheduler.core import build

        if build() != expected:
            raise pytest.UsageError(
                f"expected the {expected} scheduling core, but this session imports the {build()} one"
            )


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
        grpc_port=0,
        admin_token=ADMIN_TOKEN,
    )


@pytest.fixture
async def cleanup(settings: Settings) -> AsyncIterator[None]:
    """Remove the test's streams, KV buckets and Redis keys afterwards."""
    yield
    await delete_namespace(settings.nats_url, settings.redis_url, settings.namespace)


@pytest.fixture
async def bus(settings: Settings, cleanup: None) -> AsyncIterator[Bus]:
    b = await Bus.connect(settings.nats_url, Names(settings.namespace), "test")
    await b.ensure_streams()
    yield b
    await b.close()
