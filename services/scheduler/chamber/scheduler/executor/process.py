"""The process executor (`CHAMBER_EXECUTOR=process`): node agents run each replica as a process group.

The scheduler's launch becomes a request to the agent of every placed node (the node of replica 0 first: it
picks `MASTER_ADDR`/`MASTER_PORT` for the others); a stop becomes a request to SIGTERM, wait the grace, SIGKILL.
Agents report each replica on `replicas.<job>`; a `Gang` per attempt turns those reports into the job's events
(`JobStarted`, `JobFinished`, `JobStopped`, `JobLaunchFailed`), published with the usual message ids.

Nothing may keep GPUs that the ledger has given away:
- an agent silent for `CHAMBER_AGENT_TIMEOUT_S` (while this side is connected and running: the time this process
  stood still, frozen or starved past `STALLED_S`, is not counted, since heartbeats of that time may sit unread) is
  lost: its replicas end as
  lost, the rest of each gang is stopped, and the job is `JobStopped(interrupted=True)`, so it is requeued; the
  replicas of a cut-off agent stop themselves before that (their dead-man switch, see the agent's shim);
- an agent's heartbeat lists the replicas it runs: one of an attempt this executor does not hold is stopped;
- a replica its agent accepted (or reported started) that the agent's heartbeats have left out for
  `CHAMBER_AGENT_TIMEOUT_S` (an agent restarted without its state) is asked to stop: the agent, which has no record
  of it, records it as stopped and reports it ended, so the job is `JobStopped(interrupted=True)` and requeued
  instead of running forever as far as the scheduler knows (a replica that ended is not asked: its agent keeps
  its record, and a stop for it changes nothing);
- an attempt the scheduler has moved on from (its record changed attempt or released its GPUs: a launch
  deadline, a cancel) is stopped.

After a restart, `resync` rebuilds each gang from the REPLICAS stream (reports since the oldest active job was
submitted), repeats launches and stops (agents ignore repeats), and so misses no exit that happened meanwhile.
"""

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from chamber.common.bus import ORDERED_HEARTBEAT_S, Bus, PublishError
from chamber.common.clock import Clock
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import (
    AgentReply,
    AgentStatus,
    JobLaunchFailed,
    JobRecord,
    JobState,
    LaunchReplicas,
    ReplicaAssignment,
    ReplicaExited,
    ReplicaLaunchFailed,
    ReplicaReport,
    ReplicaStarted,
    StopReplicas,
)
from chamber.common.jobstore import JobStore
from chamber.common.log import get_logger
from chamber.common.settings import Settings
from chamber.common.workload import workload_problem
from chamber.scheduler.core.lifecycle import grace_left, holds_gpus
from chamber.scheduler.executor.gang import Action, End, Gang, Publish, Stop

log = get_logger(__name__)

_records = Decoder(JobRecord)
REQUEST_TIMEOUT_S = 2.0
WATCH_S = 0.25
STALLED_S = 2.0
"""A watchdog tick this late means this process did not run meanwhile (frozen, stopped, starved): the agents'
heartbeats of that time may not have been read yet, so that time is not counted as their silence."""
UNKNOWN_RESEND_S = 5.0
FORGOTTEN = "its node agent no longer knew of it (restarted without its state?)"


class ProcessExecutor:
    def __init__(
        self, bus: Bus, clock: Clock, settings: Settings, lead_fresh: Callable[[], bool] | None = None
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.lead_fresh = lead_fresh
        """False while this scheduler's lease was not confirmed lately (paused, or cut off): it then stops no
        replica on its own judgement (unknown, forgotten), since another leader may run them now (found by review:
        a leader waking from a pause stopped, as unknown, every job the new leader had launched meanwhile)."""
        self.timeout_s = settings.agent_timeout_s
        self.gangs: dict[str, Gang] = {}
        """The current attempt of every job this executor runs, by job id."""
        self.seen: dict[str, float] = {}
        """When each node's agent was last heard from."""
        self.since = clock.now()
        """Since when this side has been connected: no agent is judged on a silence this side did not hear."""
        self._started = False
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._unknown: dict[tuple[str, str, int, int], float] = {}
        self._publishing: dict[str, asyncio.Future[None]] = {}
        self._launching: set[tuple[str, str]] = set()
        self._by_node: dict[str, set[str]] = {}
        """node -> the jobs whose gang has a replica there (pruned as heartbeats come in)."""
        self._missing: dict[tuple[str, int, int], tuple[str, float]] = {}
        """(job, attempt, replica) -> (its node, since when that node's agent's heartbeats leave it out)."""
        self._watchdog: asyncio.Task[None] | None = None

    # ---- the seam -----------------------------------------------------------------------------------------------

    async def launch(self, record: JobRecord) -> None:
        await self._start(None)
        problem = workload_problem(record.spec, "process")
        if problem is not None:
            event = JobLaunchFailed(
                job_id=record.id, attempt=record.attempt, failed_at=self.clock.now(), reason=problem
            )
            await self._publish_now(Publish(event, "launch-failed"))
            return
        gang = self._track(record)
        if gang is None or gang.done or gang.requested is not None:
            return
        await self._launch(record, gang)

    async def stop(self, record: JobRecord, reason: str, grace_s: float = 0.0) -> None:
        await self._start(None)
        gang = self._track(record)
        if gang is None:
            return
        self._act(gang, gang.stop(reason, grace_s))

    async def resync(self, records: Iterable[JobRecord]) -> None:
        active = [r for r in records if r.placement is not None]
        gangs = [(r, self._track(r)) for r in active]
        for record, gang in gangs:
            if gang is not None and record.state == JobState.RUNNING:
                gang.started_at = record.started_at
        now = self.clock.now()
        stops: dict[str, tuple[str, float]] = {}
        for record, gang in gangs:
            if gang is None:
                continue
            if record.cancel_requested:
                stops[record.id] = ("cancelled", 0.0)
            elif record.stopping:
                stops[record.id] = (record.stop_reason, grace_left(record, now))
            if record.id in stops and gang.requested is None:
                # Known before the replay: a replica that ended on this stop is not taken for an interruption
                # (which would stop the rest at once, cutting their checkpoint grace).
                gang.requested = stops[record.id]
        await self._start(min((r.submitted_at for r in active), default=None))
        for record, gang in gangs:
            if gang is None:
                continue
            if record.id in stops:
                self._act(gang, gang.stop(*stops[record.id]))
            elif record.state != JobState.RUNNING:
                self._spawn(self.launch(record))

    async def close(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for task in [*self._tasks, *([self._watchdog] if self._watchdog else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._watchdog] if self._watchdog else []), return_exceptions=True)

    # ---- tracking ---------------------------------------------------------------------------------------------

    def _track(self, record: JobRecord) -> Gang | None:
        """The gang of the record's current attempt (created from its placement when new)."""
        gang = self.gangs.get(record.id)
        if gang is not None and gang.attempt == record.attempt:
            return gang
        if record.placement is None or (gang is not None and gang.attempt > record.attempt):
            return None
        per = record.spec.gpus_per_replica
        gpus = record.placement.gpus
        groups = [gpus[r * per : (r + 1) * per] for r in range(len(gpus) // per)]
        gang = Gang(
            job_id=record.id, attempt=record.attempt, nodes=[g[0].node for g in groups],
            gpus=[[g.index for g in group] for group in groups], grace_s=record.spec.checkpoint_grace_s,
        )  # fmt: skip
        self.gangs[record.id] = gang
        for node in set(gang.nodes):
            self._by_node.setdefault(node, set()).add(record.id)
        return gang

    async def _start(self, since: float | None) -> None:
        """Follow agents' reports, their heartbeats and the job records (once)."""
        if self._started:
            return
        self._started = True
        names = self.bus.names
        config = ConsumerConfig()
        if since is not None:
            config.deliver_policy = DeliverPolicy.BY_START_TIME
            config.opt_start_time = datetime.fromtimestamp(max(0.0, since - 1.0), UTC)
        else:
            config.deliver_policy = DeliverPolicy.NEW
        self._subs.append(
            await self.bus.js.subscribe(
                names.subject("replicas.>"),
                cb=self._on_report,
                ordered_consumer=True,
                config=config,
                idle_heartbeat=ORDERED_HEARTBEAT_S,
            )
        )
        self._subs.append(await self.bus.nc.subscribe(names.subject("agents.status.>"), cb=self._on_status))
        records = await JobStore.open(self.bus)  # (made here if the scheduler has not made it yet)
        self._subs.append(
            await self.bus.js.subscribe(
                f"{records.prefix}>", stream=records.stream, cb=self._on_record, ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW, idle_heartbeat=ORDERED_HEARTBEAT_S,
            )
        )  # fmt: skip
        self._watchdog = asyncio.create_task(self._watch(), name="process-executor-watchdog")

    # ---- launching ----------------------------------------------------------------------------------------------

    async def _launch(self, record: JobRecord, gang: Gang) -> None:
        spec = record.spec
        assert spec.command is not None
        order: list[str] = []
        for node in gang.nodes:  # the node of replica 0 first
            if node not in order:
                order.append(node)

        def request(node: str, addr: str, port: int) -> LaunchReplicas:
            return LaunchReplicas(
                job_id=record.id, attempt=record.attempt, replicas=gang.replicas,
                assignments=[ReplicaAssignment(replica=r, gpus=gang.gpus[r]) for r in gang.on_node(node)],
                command=list(spec.command or []), env=dict(spec.env), working_dir=spec.working_dir,
                master_addr=addr, master_port=port,
            )  # fmt: skip

        first = await self._ask_launch(gang, order[0], request(order[0], "", 0))
        if not self._launched(gang, order[0], first):
            return
        assert first is not None
        await asyncio.gather(
            *(self._launch_on(gang, node, request(node, first.master_addr, first.master_port)) for node in order[1:])
        )

    async def _launch_on(self, gang: Gang, node: str, req: LaunchReplicas) -> None:
        self._launched(gang, node, await self._ask_launch(gang, node, req))

    async def _ask_launch(self, gang: Gang, node: str, req: LaunchReplicas) -> AgentReply | None:
        """A launch request; while it waits for an answer, the launch (not the watchdog) judges that node."""
        key = (gang.job_id, node)
        self._launching.add(key)
        try:
            return await self._request(gang, node, "launch", req)
        finally:
            self._launching.discard(key)

    def _launched(self, gang: Gang, node: str, reply: AgentReply | None) -> bool:
        if reply is not None and reply.ok:
            gang.accepted.add(node)
            return True
        if self.gangs.get(gang.job_id) is not gang or gang.done:
            return False
        reason = f"no node agent answers on {node}" if reply is None else f"{node}: {reply.error}"
        log.warning("process_executor.launch_failed", job_id=gang.job_id, attempt=gang.attempt, reason=reason)
        self._act(gang, gang.launch_failed(gang.on_node(node), reason, self.clock.now(), node))
        return False

    async def _request(self, gang: Gang, node: str, op: str, payload: msgspec.Struct) -> AgentReply | None:
        """Ask `node`'s agent, retrying while it does not answer and is not yet judged lost."""
        subject = self.bus.names.agent_request(node, op)
        data = encode(payload)
        deadline = self.clock.now() + self.timeout_s
        delay = 0.1
        while True:
            try:
                msg = await self.bus.nc.request(subject, data, timeout=REQUEST_TIMEOUT_S)
                return Decoder(AgentReply).decode(msg.data)  # type: ignore[no-any-return]
            except DecodeError as exc:
                return AgentReply(ok=False, error=f"undecodable answer: {exc}")
            except (nats.errors.Error, TimeoutError) as exc:
                if self.clock.now() >= deadline or self.gangs.get(gang.job_id) is not gang:
                    log.warning("process_executor.agent_silent", node=node, op=op, error=repr(exc))
                    return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # ---- acting ---------------------------------------------------------------------------------------------------

    def _act(self, gang: Gang, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Publish):
                if action.final and self.gangs.get(gang.job_id) is gang:
                    del self.gangs[gang.job_id]
                previous = self._publishing.get(gang.job_id)
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._publishing[gang.job_id] = done
                self._spawn(self._publish(action, previous, done))
            else:
                self._spawn(self._stop_on(gang, action))

    async def _stop_on(self, gang: Gang, stop: Stop) -> None:
        req = StopReplicas(
            job_id=gang.job_id, attempt=gang.attempt, grace_s=stop.grace_s, reason=stop.reason,
            replicas=list(stop.replicas),
        )  # fmt: skip
        while True:
            reply = await self._request(gang, stop.node, "stop", req)
            if reply is not None and reply.ok:
                return
            if not any(r in gang.live() for r in stop.replicas) or self.gangs.get(gang.job_id) is not gang:
                return
            if reply is not None:
                log.error("process_executor.stop_refused", node=stop.node, job_id=gang.job_id, error=reply.error)
            await asyncio.sleep(1.0)  # the watchdog ends it when the agent is judged lost

    async def _publish(self, action: Publish, after: asyncio.Future[None] | None, done: asyncio.Future[None]) -> None:
        """Publish a job event after the previous one of the same job (a start is stored before its end)."""
        job_id = action.event.job_id
        try:
            if after is not None:
                await asyncio.shield(after)
            await self._publish_now(action)
        finally:
            done.set_result(None)
            if self._publishing.get(job_id) is done:
                del self._publishing[job_id]

    async def _publish_now(self, action: Publish) -> None:
        event = action.event
        msg_id = f"{event.job_id}:{event.attempt}:{action.what}"
        while True:
            try:
                await self.bus.publish(self.bus.names.job_lifecycle(event.job_id), event, msg_id=msg_id)
                log.info("process_executor.reported", job_id=event.job_id, attempt=event.attempt, what=action.what)
                return
            except PublishError as exc:
                log.warning("process_executor.publish_failed", job_id=event.job_id, error=str(exc))
                await asyncio.sleep(0.5)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("process_executor.task_failed", error=repr(task.exception()))

    # ---- what comes in ----------------------------------------------------------------------------------------------

    async def _on_report(self, msg: Any) -> None:
        try:
            report: ReplicaReport = Decoder(ReplicaReport).decode(msg.data)
        except DecodeError as exc:
            log.warning("process_executor.bad_report", subject=msg.subject, error=str(exc))
            return
        gang = self.gangs.get(report.job_id)
        if gang is None or gang.attempt != report.attempt:
            return
        self.seen[report.node] = max(self.seen.get(report.node, 0.0), self.clock.now())
        if isinstance(report, ReplicaStarted):
            actions = gang.replica_started(report.replica, report.started_at)
        elif isinstance(report, ReplicaExited):
            end = End(
                at=report.exited_at, node=report.node, exit_code=report.exit_code, signal=report.signal,
                stop_requested=report.stop_requested, lost=report.lost,
                never_started=report.exit_code is None and report.signal is None and not report.lost,
                message=report.message, fenced=report.fenced,
            )  # fmt: skip
            actions = gang.replica_ended(report.replica, end)
        elif isinstance(report, ReplicaLaunchFailed):
            actions = gang.launch_failed([report.replica], report.reason, report.failed_at, report.node)
        self._act(gang, actions)

    async def _on_status(self, msg: Any) -> None:
        try:
            status: AgentStatus = Decoder(AgentStatus).decode(msg.data)
        except DecodeError:
            return
        now = self.clock.now()
        self.seen[status.node] = now
        if self.lead_fresh is not None and not self.lead_fresh():
            return  # judged at a heartbeat after the lease was confirmed again, or by the next leader
        for running in status.replicas:
            gang = self.gangs.get(running.job_id)
            if gang is not None and gang.attempt == running.attempt and running.replica in gang.live():
                continue
            key = (status.node, running.job_id, running.attempt, running.replica)
            if now - self._unknown.get(key, float("-inf")) < UNKNOWN_RESEND_S:
                continue
            self._unknown[key] = now
            log.warning("process_executor.unknown_replica", node=status.node, job_id=running.job_id,
                        attempt=running.attempt, replica=running.replica)  # fmt: skip
            self._spawn(self._stop_unknown(status.node, running.job_id, running.attempt, running.replica))
        self._judge_forgotten(status, now)

    def _judge_forgotten(self, status: AgentStatus, now: float) -> None:
        """Replicas of this node that its agent should list (it accepted their launch, or they started) but has
        left out of every heartbeat for `timeout_s` are asked to stop (see the module's docstring)."""
        jobs = self._by_node.get(status.node)
        if not jobs:
            return
        listed = {(r.job_id, r.attempt, r.replica) for r in status.replicas}
        for job_id in list(jobs):
            gang = self.gangs.get(job_id)
            if gang is None or status.node not in gang.live_nodes():
                jobs.discard(job_id)
                for key in [k for k, (node, _) in self._missing.items() if k[0] == job_id and node == status.node]:
                    del self._missing[key]
                continue
            if (job_id, status.node) in self._launching:
                continue
            for replica in gang.on_node(status.node):
                key = (job_id, gang.attempt, replica)
                expected = replica in gang.started or status.node in gang.accepted
                if replica in gang.ends or not expected or key in listed:
                    self._missing.pop(key, None)
                    continue
                since = self._missing.setdefault(key, (status.node, now))[1]
                if now - since < self.timeout_s:
                    continue
                del self._missing[key]  # asked again after another `timeout_s` if nothing comes of it
                log.warning("process_executor.forgotten_replica", node=status.node, job_id=job_id,
                            attempt=gang.attempt, replica=replica, missing_s=round(now - since, 1))  # fmt: skip
                self._spawn(self._stop_unknown(status.node, job_id, gang.attempt, replica, FORGOTTEN))

    async def _stop_unknown(
        self, node: str, job_id: str, attempt: int, replica: int, reason: str = "no longer holds its GPUs"
    ) -> None:
        req = StopReplicas(job_id=job_id, attempt=attempt, grace_s=0.0, reason=reason, replicas=[replica])
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await self.bus.nc.request(
                self.bus.names.agent_request(node, "stop"), encode(req), timeout=REQUEST_TIMEOUT_S
            )

    async def _on_record(self, msg: Any) -> None:
        """An attempt the scheduler has moved on from (a new version of its record, in the jobs KV bucket) is
        stopped (it will not hear of it again)."""
        try:
            record = _records.decode(msg.data)
        except DecodeError:
            return  # (a delete or a purge: no record)
        gang = self.gangs.get(record.id)
        if gang is None or record.attempt < gang.attempt:
            return
        if record.attempt == gang.attempt and holds_gpus(record):
            return
        del self.gangs[record.id]
        if gang.live():
            log.warning("process_executor.abandoned_attempt", job_id=gang.job_id, attempt=gang.attempt)
            for action in gang.stop("the attempt no longer holds its GPUs", 0.0):
                if isinstance(action, Stop):
                    self._spawn(self._stop_on(gang, action))

    async def _watch(self) -> None:
        """Judge agents by their heartbeats, but only over time this side was connected and running to hear them
        (a scheduler frozen past the agent timeout used to find every agent lost when it woke, and interrupt every
        job they ran)."""
        last = time.monotonic()  # this process's own stalls, whatever the injected clock does
        while True:
            await asyncio.sleep(WATCH_S)
            now, tick = self.clock.now(), time.monotonic()
            gap, last = tick - last, tick
            if gap > STALLED_S:  # the time it stood still is nobody's silence (only that time: a loop that is
                deaf = gap - WATCH_S  # often slow must still find a dead agent)
                log.warning("process_executor.stalled", seconds=round(gap, 1))
                self.since = min(now, self.since + deaf)
                self.seen = {node: min(now, at + deaf) for node, at in self.seen.items()}
                self._missing = {key: (node, min(now, at + deaf)) for key, (node, at) in self._missing.items()}
                continue
            if not self.bus.nc.is_connected:
                self.since = now
                continue
            self._unknown = {k: at for k, at in self._unknown.items() if now - at < UNKNOWN_RESEND_S}
            for gang in list(self.gangs.values()):
                for node in sorted(gang.live_nodes()):
                    if (gang.job_id, node) in self._launching:
                        continue  # an agent that never answers the launch fails the launch instead
                    if now - max(self.seen.get(node, self.since), self.since) > self.timeout_s:
                        log.warning("process_executor.agent_lost", node=node, job_id=gang.job_id)
                        self._act(gang, gang.node_lost(node, now))
                        self._by_node.get(node, set()).discard(gang.job_id)  # nothing left of it there to judge
