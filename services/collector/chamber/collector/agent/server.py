"""A node's runner on the bus: answers launch, stop and logs requests, sends the replicas' reports, heartbeats.

- Requests (`agent.<node>.launch|stop|logs`) are answered at once; the runner's methods are idempotent, so the
  executor may repeat them.
- **Reports** go to `replicas.<job>` with message ids (`<job>:<attempt>:<replica>:<what>`) and are marked in the
  replica's state file only once JetStream acknowledged them; whatever is unmarked is sent again (after a
  restart too).
- **Heartbeat** (`agents.status.<node>`, every `heartbeat_s`): the replicas that run here, so the executor can
  stop any it does not know, and notice when this agent is gone. While connected, the server touches each
  replica's lease (the shims' dead-man switch). The heartbeat never waits on JetStream: reports are sent by one
  flusher task of their own, so a JetStream that does not acknowledge for a while (a stream leader election)
  delays reports, not heartbeats, and no replica fences itself on a healthy node.
"""

import asyncio
import contextlib
from typing import Any

import msgspec

from chamber.collector.agent.reports import pending_reports
from chamber.collector.agent.runner import NodeRunner, RunnerConfig
from chamber.common.bus import Bus, PublishError
from chamber.common.clock import Clock
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import AgentReply, AgentStatus, LaunchReplicas, LogsRequest, RunningReplica, StopReplicas
from chamber.common.log import get_logger
from chamber.common.runtime import wait_event

log = get_logger(__name__)

GC_EVERY_S = 3600.0
MAX_REFUSED_PER_FLUSH = 3


class AgentServer:
    def __init__(self, bus: Bus, clock: Clock, config: RunnerConfig) -> None:
        self.bus = bus
        self.clock = clock
        self.config = config
        self.node = config.node
        self.runner = NodeRunner(clock, config, on_change=self._changed)
        self.started_at = clock.now()
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flushing = asyncio.Lock()
        self._stop = asyncio.Event()
        self._heartbeat: asyncio.Task[None] | None = None
        self._dirty = asyncio.Event()
        """Something may have to be reported: wakes the flusher."""
        self._last_gc = float("-inf")

    def owner(self, pid: int, gpu_index: int) -> str:
        return self.runner.owner(pid, gpu_index)

    async def start(self) -> None:
        self.runner.adopt()
        names = self.bus.names
        for op, handler in (("launch", self._on_launch), ("stop", self._on_stop), ("logs", self._on_logs)):
            self._subs.append(await self.bus.nc.subscribe(names.agent_request(self.node, op), cb=handler))
        self._heartbeat = asyncio.create_task(self._beat(), name=f"agent-{self.node}")
        flusher = asyncio.create_task(self._flusher(), name=f"agent-{self.node}-reports")
        self._tasks.add(flusher)
        self._dirty.set()  # what a previous run left unreported
        log.info("agent.started", node=self.node, gpus=len(self.config.gpus), adopted=len(self.runner.live()))

    async def close(self) -> None:
        """Stop serving; the replicas keep running (a restarted agent adopts them)."""
        self._stop.set()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        if self._heartbeat is not None:
            await self._heartbeat
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.runner.close()

    # ---- requests ----------------------------------------------------------------------------------------------

    async def _on_launch(self, msg: Any) -> None:
        try:
            request: LaunchReplicas = Decoder(LaunchReplicas).decode(msg.data)
        except DecodeError as exc:
            await _respond(msg, AgentReply(ok=False, error=f"bad launch request: {exc}"))
            return
        await _respond(msg, self.runner.launch(request))

    async def _on_stop(self, msg: Any) -> None:
        try:
            request: StopReplicas = Decoder(StopReplicas).decode(msg.data)
        except DecodeError as exc:
            await _respond(msg, AgentReply(ok=False, error=f"bad stop request: {exc}"))
            return
        await _respond(msg, self.runner.stop(request))

    async def _on_logs(self, msg: Any) -> None:
        try:
            request: LogsRequest = Decoder(LogsRequest).decode(msg.data)
        except DecodeError:
            return
        await _respond(msg, self.runner.logs(request))

    # ---- reports and heartbeat ------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._dirty.set()

    async def _flusher(self) -> None:
        """Send what is unreported whenever something changed (and at every heartbeat, to retry)."""
        while not self._stop.is_set():
            await self._dirty.wait()
            self._dirty.clear()
            await self._flush()

    async def _flush(self) -> None:
        """Publish every report not yet acknowledged, in order per replica; mark each once JetStream has it. A
        replica whose report is refused waits for the next flush, and the others go on (found by review: one
        replica whose reports could never be published held back every later one's), unless refusals pile up
        (JetStream is away: each would wait for its own time-out)."""
        refused = 0
        async with self._flushing:
            for replica in list(self.runner.replicas.values()):
                s = replica.state
                for what, report in pending_reports(self.node, s):
                    try:
                        await self.bus.publish(
                            self.bus.names.replica_reports(s.job_id), report,
                            msg_id=f"{s.job_id}:{s.attempt}:{s.replica}:{what}",
                        )  # fmt: skip
                    except PublishError as exc:
                        log.warning("agent.report_failed", job_id=s.job_id, what=what, error=str(exc))
                        refused += 1
                        break
                    s.reported.append(what)
                    self.runner.save(replica, durable=False)  # lost to a power cut: sent again, deduplicated
                if refused >= MAX_REFUSED_PER_FLUSH:
                    return

    async def _beat(self) -> None:
        while not self._stop.is_set():
            try:
                await self._beat_once()
            except Exception:  # one bad turn must not end the heartbeat (the replicas would fence themselves)
                log.exception("agent.heartbeat_error", node=self.node)
            await wait_event(self._stop, self.config.heartbeat_s)

    async def _beat_once(self) -> None:
        """Publish the status; touch the leases only after the server answered a round trip within the beat: a
        connection that looks open while the network drops everything (nats-py notices after minutes) must let the
        shims fence, as the executor counts the agent lost when its heartbeats stop (found by review: replicas ran
        on beside their requeued copies)."""
        now = self.clock.now()
        status = AgentStatus(
            node=self.node, at=now, started_at=self.started_at, address=self.config.address,
            replicas=[
                RunningReplica(job_id=r.state.job_id, attempt=r.state.attempt, replica=r.state.replica,
                               pid=r.state.child_pid, gpus=r.state.gpus)
                for r in self.runner.live()
            ],
        )  # fmt: skip
        try:
            await self.bus.publish_nowait(self.bus.names.agent_status(self.node), status)
        except PublishError as exc:
            log.warning("agent.heartbeat_failed", node=self.node, error=str(exc))
        if await self._server_answers():
            self.runner.touch_leases()
        self._dirty.set()  # retry what failed to go out (never waited for here)
        if now - self._last_gc >= GC_EVERY_S:
            self._last_gc = now
            self.runner.collect_garbage(now)

    async def _server_answers(self) -> bool:
        """A PING answered by the NATS server within the heartbeat (after the status just published)."""
        if not self.bus.nc.is_connected:
            return False
        try:
            await asyncio.wait_for(self.bus.nc.flush(), timeout=max(0.1, self.config.heartbeat_s))
        except Exception as exc:  # nats-py: a time-out, or the connection closing meanwhile
            log.warning("agent.server_silent", node=self.node, error=repr(exc))
            return False
        return True


async def _respond(msg: Any, reply: msgspec.Struct) -> None:
    if not msg.reply:
        return
    try:
        await msg.respond(encode(reply))
    except Exception as exc:  # the requester is gone or the connection broke: it will ask again
        log.warning("agent.reply_failed", subject=msg.subject, error=repr(exc))
