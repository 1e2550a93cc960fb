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

from chamber.collector.agent.runner import Replica, RunnerConfig
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

    async def flush(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 (nats-py's signature)
        return None


class _Blackholed(_Core):
    """A connection that looks open while the network drops everything: no PING is ever answered."""

    async def flush(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 (nats-py's signature)
        await asyncio.sleep(timeout)
        raise TimeoutError("nats: flush timeout")


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


async def _serving(bus: object, tmp_path: Path) -> AgentServer:
    """An agent for one GPU, with a 2 s agent timeout (its shims fence after 1 s without a lease touch)."""
    config = RunnerConfig(
        node="n1", gpus=[GpuDevice(index=0, uuid="GPU-a", model="H100")], root=tmp_path / "agent",
        checkpoint_root=tmp_path / "ck", address="127.0.0.1", timeout_s=2.0, heartbeat_s=0.1,
    )  # fmt: skip
    server = AgentServer(bus, SystemClock(), config)  # type: ignore[arg-type]
    await server.start()
    return server


def _sleeper(server: AgentServer) -> Replica:
    """A replica that sleeps, launched on the agent."""
    req = LaunchReplicas(job_id="j1", attempt=1, replicas=1, command=["sleep", "1000"],
                         assignments=[ReplicaAssignment(replica=0, gpus=[0])])  # fmt: skip
    assert server.runner.launch(req).ok
    return server.runner.replicas[("j1", 1, 0)]


async def test_heartbeats_and_leases_go_on_while_jetstream_does_not_acknowledge(tmp_path: Path) -> None:
    bus = SilentJetStream()
    server = await _serving(bus, tmp_path)
    replica = None
    try:
        replica = _sleeper(server)
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


async def test_a_silently_cut_off_agent_lets_its_replicas_fence_themselves(tmp_path: Path) -> None:
    """Found by review: the leases were touched while nats-py still thought itself connected, minutes into a
    partition that dropped every packet, so the replicas ran on beside the copies the executor requeued when the
    heartbeats stopped reaching it. A lease is touched only after the server answered a round trip."""
    bus = SilentJetStream()
    bus.nc = _Blackholed()
    server = await _serving(bus, tmp_path)
    replica = None
    try:
        replica = _sleeper(server)
        for _ in range(100):  # the fence: half the agent timeout without a touch, then its grace
            if replica.state.ending is not None:
                break
            await asyncio.sleep(0.1)
        assert replica.state.ending is not None, "the replica still runs, unfenced"
        assert replica.state.ending.fenced
    finally:
        if replica is not None and replica.state.ending is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(replica.state.shim_pid, signal.SIGKILL)
        await server.close()


@pytest.mark.parametrize("job_id", ["x\x00", "a b", "/tmp/elsewhere", "../up", "x\n", ""])
def test_an_agent_refuses_a_job_id_that_could_name_no_job(job_id: str) -> None:
    """Found by review: a NUL in a launch's job id ended the heartbeat, a space made the replica's reports
    unpublishable (holding back every later replica's), an absolute path read logs outside the agent's
    directory. The requests' decoder refuses them (the agent answers ok=False)."""
    import msgspec

    from chamber.common.codec import DecodeError, Decoder
    from chamber.common.contracts import LogsRequest, StopReplicas

    for kind, extra in ((LaunchReplicas, {"replicas": 1, "command": ["true"],
                                         "assignments": [{"replica": 0, "gpus": [0]}]}),
                        (StopReplicas, {}), (LogsRequest, {})):  # fmt: skip
        raw = msgspec.json.encode({"kind": kind.__name__, "job_id": job_id, "attempt": 1, **extra})
        with pytest.raises(DecodeError, match="job_id"):
            Decoder(kind).decode(raw)


class _RefusesOne(SilentJetStream):
    """JetStream takes every report but those of job `j-bad`."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[str] = []

    async def publish(self, subject: str, event: object, msg_id: str | None = None) -> None:
        from chamber.common.bus import PublishError

        if "j-bad" in subject:
            raise PublishError("refused (injected)")
        self.published.append(subject)


async def test_a_replica_whose_reports_are_refused_does_not_hold_back_the_others(tmp_path: Path) -> None:
    """Found by review: the flush gave up at the first refused report, so one replica whose reports could not go
    out held back every later replica's reports (their jobs never started or ended for the scheduler)."""
    bus = _RefusesOne()
    config = RunnerConfig(
        node="n1", gpus=[GpuDevice(index=i, uuid=f"GPU-{i}", model="H100") for i in (0, 1)],
        root=tmp_path / "agent", checkpoint_root=tmp_path / "ck", address="127.0.0.1", timeout_s=30.0,
        heartbeat_s=0.1,
    )  # fmt: skip
    server = AgentServer(bus, SystemClock(), config)  # type: ignore[arg-type]
    await server.start()
    try:
        for job_id, gpu in (("j-bad", 0), ("j-good", 1)):
            req = LaunchReplicas(job_id=job_id, attempt=1, replicas=1, command=["true"],
                                 assignments=[ReplicaAssignment(replica=0, gpus=[gpu])])  # fmt: skip
            assert server.runner.launch(req).ok
        for _ in range(100):
            if any("j-good" in s for s in bus.published):
                break
            await asyncio.sleep(0.05)
        assert any("j-good" in s for s in bus.published), bus.published
    finally:
        await server.close()
