"""The agent's heartbeat and lease touches never wait on JetStream. Reports used to be flushed inside the heartbeat
loop: while JetStream did not acknowledge (a stream leader election), each queued flush cost a publish timeout,
no heartbeat went out and no lease was touched, and every replica on the healthy node fenced itself. A unit test
of the loops: the bus here is one whose JetStream never answers (a real server cannot be made to do that on cue)."""

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from chamber.collector.agent.runner import RunnerConfig
from chamber.collector.agent.server import AgentServer
from chamber.common.clock import SystemClock
from chamber.common.contracts import GpuDevice, LaunchReplicas, ReplicaAssignment
from chamber.common.subjects import Names

pytestmark = pytest.mark.timeout(30)


class _Core:
    is_connected = True

    async def subscribe(self, subject: str, cb: Any) -> "_Core":
        return self

    async def unsubscribe(self) -> None:
        return None


class SilentJetStream:
    """Core NATS works (heartbeats go out); JetStream publishes are never acknowledged."""

    def __init__(self) -> None:
        self.nc = _Core()
        self.names = Names("hb")
        self.heartbeats = 0
        self.reports_waiting = 0

    async def publish(self, subject: str, event: object, msg_id: str | None = None) -> None:
        self.reports_waiting += 1
        await asyncio.Event().wait()  # never acknowledged

    async def publish_nowait(self, subject: str, event: object) -> None:
        self.heartbeats += 1


async def test_heartbeats_and_leases_go_on_while_jetstream_does_not_acknowledge(tmp_path: Path) -> None:
    bus = SilentJetStream()
    config = RunnerConfig(
        node="n1", gpus=[GpuDevice(index=0, uuid="GPU-a", model="H100")], root=tmp_path / "agent",
        checkpoint_root=tmp_path / "ck", address="127.0.0.1", timeout_s=2.0, heartbeat_s=0.1,
    )  # fmt: skip
    server = AgentServer(bus, SystemClock(), config)  # type: ignore[arg-type]
    await server.start()
    replica = None
    try:
        req = LaunchReplicas(job_id="j1", attempt=1, replicas=1, command=["sleep", "1000"],
                             assignments=[ReplicaAssignment(replica=0, gpus=[0])])  # fmt: skip
        assert server.runner.launch(req).ok
        replica = server.runner.replicas[("j1", 1, 0)]
        await asyncio.sleep(2.5)  # past the shims' fence (half the 2 s agent timeout), twice over
        assert bus.reports_waiting >= 1, "a report is stuck in JetStream"
        assert bus.heartbeats >= 15, bus.heartbeats
        assert replica.live, "its lease was touched: the shim did not fence itself"
        assert replica.state.ending is None
    finally:
        if replica is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica.state.shim_pid, signal.SIGKILL)
        await server.close()
