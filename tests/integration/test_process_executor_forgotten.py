"""A replica its node agent forgot (the agent restarted without its state) does not leave its job running forever
as far as the scheduler knows: the process executor, on real NATS, against a scripted agent that accepts a gang's
launch and then lists only one of its two replicas in its heartbeats."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from chamber.common.bus import Bus
from chamber.common.clock import SystemClock
from chamber.common.codec import Decoder, encode
from chamber.common.contracts import (
    AgentReply,
    AgentStatus,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    JobStopped,
    Placement,
    ReplicaExited,
    ReplicaStarted,
    RunningReplica,
    StopReplicas,
)
from chamber.common.settings import Settings
from chamber.scheduler.executor.process import FORGOTTEN, ProcessExecutor
from tests.support.agents import job_events
from tests.support.services import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NODE = "node-a"
TIMEOUT_S = 1.0


class ScriptedAgent:
    """Answers launches and stops on `NODE` and heartbeats the replicas it is told to list."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.listed: list[int] = []
        self.stops: list[tuple[float, StopReplicas]] = []
        self._subs: list[Any] = []
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        names = self.bus.names

        async def launch(msg: Any) -> None:
            await msg.respond(encode(AgentReply(ok=True, master_addr=NODE, master_port=29500)))

        async def stop(msg: Any) -> None:
            self.stops.append((time.monotonic(), Decoder(StopReplicas).decode(msg.data)))
            await msg.respond(encode(AgentReply(ok=True)))

        self._subs = [
            await self.bus.nc.subscribe(names.agent_request(NODE, "launch"), cb=launch),
            await self.bus.nc.subscribe(names.agent_request(NODE, "stop"), cb=stop),
        ]
        self._beat = asyncio.create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        started = time.time()
        while True:
            replicas = [RunningReplica(job_id="j", attempt=1, replica=r, pid=100 + r, gpus=[r]) for r in self.listed]
            status = AgentStatus(node=NODE, at=time.time(), started_at=started, replicas=replicas)
            await self.bus.publish_nowait(self.bus.names.agent_status(NODE), status)
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        for sub in self._subs:
            await sub.unsubscribe()
        self._beat, self._subs = None, []  # (closed twice: once is enough)

    async def report(self, report: msgspec.Struct, what: str) -> None:
        job_id, replica = report.job_id, report.replica  # type: ignore[attr-defined]
        await self.bus.publish(self.bus.names.replica_reports(job_id), report, msg_id=f"{job_id}:1:{replica}:{what}")


def gang_record() -> JobRecord:
    now = time.time()
    spec = JobSpec(name="j", team="t", gpus_per_replica=1, replicas=2, command=["sleep", "600"])
    placement = Placement(attempt=1, gpus=[GpuRef(NODE, 0), GpuRef(NODE, 1)])
    return JobRecord(id="j", spec=spec, state=JobState.PENDING, submitted_at=now, updated_at=now, attempt=1,
                     placement=placement)  # fmt: skip


async def test_a_replica_its_agent_no_longer_lists_is_stopped_and_the_job_requeued(
    bus: Bus, settings: Settings
) -> None:
    agent = ScriptedAgent(bus)
    await agent.start()
    executor = ProcessExecutor(bus, SystemClock(), msgspec.structs.replace(settings, agent_timeout_s=TIMEOUT_S))
    try:
        launched = time.monotonic()  # before the agent accepts: no heartbeat can leave it out earlier than this
        await executor.launch(gang_record())
        agent.listed = [0]  # replica 1 was accepted, then forgotten
        for replica in (0, 1):
            await agent.report(ReplicaStarted(node=NODE, job_id="j", attempt=1, replica=replica, pid=100 + replica,
                                              started_at=time.time()), "started")  # fmt: skip

        await eventually(lambda: agent.stops, within=10, what="the forgotten replica is asked to stop")
        at, stop = agent.stops[0]
        assert stop.replicas == [1], "only the replica its agent left out"
        assert stop.reason == FORGOTTEN
        assert at - launched >= TIMEOUT_S, "not before the agent has left it out for the agent timeout"

        # What the agent, having no record of it, reports: stopped before it started (its tombstone).
        await agent.report(ReplicaExited(node=NODE, job_id="j", attempt=1, replica=1, exited_at=time.time(),
                                         stop_requested=True, message=f"stopped before it started: {FORGOTTEN}"),
                           "exited")  # fmt: skip
        await eventually(
            lambda: [s for _, s in agent.stops if s.replicas == [0]], within=10, what="the rest of the gang stopped"
        )
        agent.listed = []
        await agent.report(ReplicaExited(node=NODE, job_id="j", attempt=1, replica=0, exited_at=time.time(),
                                         signal=15, stop_requested=True), "exited")  # fmt: skip

        async def stopped() -> list[JobStopped]:
            return [e for e in await job_events(bus, "j") if isinstance(e, JobStopped)]

        await eventually(stopped, within=10, what="the job is reported stopped")
        (event,) = await stopped()
        assert event.interrupted, "an interruption: the job is requeued, with its checkpoint accounting"
        assert FORGOTTEN in event.reason
    finally:
        await executor.close()
        await agent.close()


async def test_a_replica_its_agent_lists_is_never_asked_to_stop(bus: Bus, settings: Settings) -> None:
    agent = ScriptedAgent(bus)
    await agent.start()
    executor = ProcessExecutor(bus, SystemClock(), msgspec.structs.replace(settings, agent_timeout_s=TIMEOUT_S))
    try:
        agent.listed = [0, 1]
        await executor.launch(gang_record())
        await asyncio.sleep(3 * TIMEOUT_S)
        assert agent.stops == []
    finally:
        await executor.close()
        await agent.close()


@contextlib.asynccontextmanager
async def _running_gang(bus: Bus, settings: Settings, agent_timeout_s: float) -> AsyncIterator[ScriptedAgent]:
    """A two-replica gang running on `NODE` under a process executor with that agent timeout."""
    agent = ScriptedAgent(bus)
    await agent.start()
    executor = ProcessExecutor(bus, SystemClock(), msgspec.structs.replace(settings, agent_timeout_s=agent_timeout_s))
    try:
        agent.listed = [0, 1]
        await executor.launch(gang_record())
        for replica in (0, 1):
            await agent.report(ReplicaStarted(node=NODE, job_id="j", attempt=1, replica=replica, pid=100 + replica,
                                              started_at=time.time()), "started")  # fmt: skip
        await asyncio.sleep(0.5)
        yield agent
    finally:
        await executor.close()
        await agent.close()


async def _stopped(bus: Bus) -> list[JobStopped]:
    return [e for e in await job_events(bus, "j") if isinstance(e, JobStopped)]


async def test_a_scheduler_frozen_past_the_agent_timeout_judges_no_agent_lost_when_it_wakes(
    bus: Bus, settings: Settings
) -> None:
    """This process stops for three agent timeouts (as under SIGSTOP or a stalled VM: the event loop, the agent's
    heartbeats and all, stands still). When it runs again, the watchdog's tick is due before any heartbeat is read:
    it must not take the silence it could not hear for a lost agent (it used to, and interrupted every job)."""
    async with _running_gang(bus, settings, TIMEOUT_S) as agent:
        time.sleep(3 * TIMEOUT_S)  # noqa: ASYNC251  # the freeze: nothing in this process runs
        await asyncio.sleep(2 * TIMEOUT_S)
        assert agent.stops == [], "no replica was asked to stop"
        assert not await _stopped(bus), "the job was not stopped"


async def test_a_dead_agent_is_judged_lost_by_a_scheduler_whose_loop_is_often_slow(
    bus: Bus, settings: Settings
) -> None:
    """The time a stalled process stood still is not counted as silence, but only that time: a loop that stalls
    over and over (big cycles, the garbage collector, a starved CPU) must still find a dead agent, or its jobs would
    hold their GPUs forever."""
    timeout = 3.0
    async with _running_gang(bus, settings, timeout) as agent:
        await agent.close()  # the agent dies: no heartbeat from now on
        died = time.monotonic()
        while not await _stopped(bus) and time.monotonic() - died < 5 * timeout:
            await asyncio.sleep(1.0)
            time.sleep(2.1)  # noqa: ASYNC251  # a stall past STALLED_S, again and again
        assert await _stopped(bus), f"the dead agent was judged lost within {5 * timeout:g} s"
