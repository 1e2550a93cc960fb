"""A process executor stops no replica on its own judgement while its scheduler's lease is not confirmed lately
(found by review: a leader waking from a pause handled the heartbeats queued meanwhile and stopped, as unknown,
every replica the new leader had launched while it slept)."""

import asyncio
from types import SimpleNamespace
from typing import Any

from chamber.common.clock import SystemClock
from chamber.common.codec import encode
from chamber.common.contracts import AgentStatus, RunningReplica
from chamber.common.settings import Settings
from chamber.common.subjects import Names
from chamber.scheduler.executor.process import ProcessExecutor


class _Nats:
    def __init__(self) -> None:
        self.requests: list[str] = []

    async def request(self, subject: str, payload: bytes, timeout: float = 1.0) -> Any:  # noqa: ASYNC109
        self.requests.append(subject)
        return SimpleNamespace(data=b"{}")


async def test_unknown_replicas_are_stopped_only_while_the_lease_is_fresh() -> None:
    nc = _Nats()
    bus = SimpleNamespace(nc=nc, names=Names("lead"))
    fresh = [False]
    executor = ProcessExecutor(bus, SystemClock(), Settings.from_env(), lead_fresh=lambda: fresh[0])  # type: ignore[arg-type]
    status = AgentStatus(node="n1", at=0.0, started_at=0.0, address="127.0.0.1",
                         replicas=[RunningReplica(job_id="theirs", attempt=1, replica=0, pid=1, gpus=[0])])  # fmt: skip
    message = SimpleNamespace(data=encode(status))
    await executor._on_status(message)
    await asyncio.sleep(0.05)
    assert nc.requests == [], "a deposed (or paused) leader stopped another leader's replica"
    fresh[0] = True
    await executor._on_status(message)
    await asyncio.sleep(0.05)
    assert nc.requests == [bus.names.agent_request("n1", "stop")]
