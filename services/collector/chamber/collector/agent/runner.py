"""The job runner of one node: answers launch, stop and logs requests, reports replicas, heartbeats.

- **Launch** (`agent.<node>.launch`): each replica placed here gets a directory, a state file and a shim, which
  starts the command in a new process group with `CUDA_VISIBLE_DEVICES` set to the placed GPUs' UUIDs and the
  gang's variables. A replica that exists is not started again, so a repeated launch is harmless.
- **Stop** (`agent.<node>.stop`): SIGTERM to each group, SIGKILL when the grace ends. The order is kept in the
  state file, so an agent restarted during the grace still kills on time. A stop for a replica that never
  launched here leaves a tombstone: a late launch will not start it.
- **Reports** go to `replicas.<job>` with message ids, and are marked in the state file only once acknowledged;
  whatever is unmarked is sent again (after a restart too).
- **Heartbeat** (`agents.status.<node>`): the replicas that run here, so the executor can stop any it does not
  know. While connected, the runner touches each replica's lease, the shims' dead-man switch.
"""

import asyncio
import contextlib
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from chamber.collector.agent.logfiles import read_log
from chamber.collector.agent.replicas import (
    Ending,
    ReplicaState,
    ReplicaStore,
    StopOrder,
    alive,
    process_start,
    read_json,
    signal_group,
    spawn_shim,
    wait_exit,
)
from chamber.common.bus import Bus, PublishError
from chamber.common.clock import Clock
from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import (
    AgentReply,
    AgentStatus,
    GpuDevice,
    LaunchReplicas,
    LogsChunk,
    LogsRequest,
    ReplicaExited,
    ReplicaLaunchFailed,
    ReplicaStarted,
    RunningReplica,
    StopReplicas,
)
from chamber.common.log import get_logger
from chamber.common.runtime import wait_event
from chamber.common.workload import RESERVED_ENV, RESERVED_PREFIXES

log = get_logger(__name__)

GC_EVERY_S = 3600.0
FENCE_AFTER = 0.5
FENCE_GRACE = 0.2
"""Shares of the agent timeout: a cut-off replica gets SIGTERM at 0.5 and SIGKILL at 0.7 of it, so it is gone
before the executor counts it lost (at 1.0) and its GPUs are given to another job."""


@dataclass(frozen=True)
class RunnerConfig:
    node: str
    gpus: list[GpuDevice]
    root: Path
    """This node's replica state (`<state>/<namespace>/agent/<node>`)."""
    checkpoint_root: Path
    address: str
    heartbeat_s: float = 2.0
    timeout_s: float = 30.0
    log_max_bytes: int = 64 * 1024 * 1024
    retention_s: float = 7 * 86400.0


@dataclass
class Replica:
    directory: Path
    state: ReplicaState
    kill_timer: asyncio.TimerHandle | None = None
    watch: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return self.state.ending is None


class NodeRunner:
    def __init__(self, bus: Bus, clock: Clock, config: RunnerConfig) -> None:
        self.bus = bus
        self.clock = clock
        self.config = config
        self.node = config.node
        self.store = ReplicaStore(config.root)
        self.replicas: dict[tuple[str, int, int], Replica] = {}
        self.started_at = clock.now()
        self._subs: list[Any] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._flushing = asyncio.Lock()
        self._stop = asyncio.Event()
        self._heartbeat: asyncio.Task[None] | None = None
        self._last_gc = float("-inf")

    # ---- life ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._adopt()
        names = self.bus.names
        for op, handler in (("launch", self._on_launch), ("stop", self._on_stop), ("logs", self._on_logs)):
            self._subs.append(await self.bus.nc.subscribe(names.agent_request(self.node, op), cb=handler))
        self._heartbeat = asyncio.create_task(self._beat(), name=f"agent-{self.node}")
        log.info("agent.started", node=self.node, gpus=len(self.config.gpus), adopted=len(self.live()))

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
        for replica in self.replicas.values():
            if replica.kill_timer is not None:
                replica.kill_timer.cancel()
            if replica.watch is not None:
                replica.watch.cancel()
        await asyncio.gather(
            *self._tasks, *(r.watch for r in self.replicas.values() if r.watch), return_exceptions=True
        )

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.live]

    def owner(self, pid: int, gpu_index: int) -> str:
        """The job whose replica on GPU `gpu_index` process `pid` belongs to (by its session); empty: none."""
        try:
            session = os.getsid(pid)
        except OSError:
            return ""
        for r in self.replicas.values():
            if r.live and r.state.shim_pid == session and gpu_index in r.state.gpus:
                return r.state.job_id
        return ""

    # ---- requests --------------------------------------------------------------------------------------------

    async def _on_launch(self, msg: Any) -> None:
        try:
            request: LaunchReplicas = Decoder(LaunchReplicas).decode(msg.data)
        except DecodeError as exc:
            await _respond(msg, AgentReply(ok=False, error=f"bad launch request: {exc}"))
            return
        await _respond(msg, self.launch(request))

    async def _on_stop(self, msg: Any) -> None:
        try:
            request: StopReplicas = Decoder(StopReplicas).decode(msg.data)
        except DecodeError as exc:
            await _respond(msg, AgentReply(ok=False, error=f"bad stop request: {exc}"))
            return
        await _respond(msg, self.stop(request))

    async def _on_logs(self, msg: Any) -> None:
        try:
            request: LogsRequest = Decoder(LogsRequest).decode(msg.data)
        except DecodeError:
            return
        await _respond(msg, self.logs(request))

    def launch(self, req: LaunchReplicas) -> AgentReply:
        gpus = self.config.gpus
        if not req.command:
            return AgentReply(ok=False, error="nothing to run: the job has no command")
        for a in req.assignments:
            bad = [i for i in a.gpus if not 0 <= i < len(gpus)]
            if bad:
                return AgentReply(ok=False, error=f"replica {a.replica}: no GPU {bad} on {self.node}")
        addr, port = req.master_addr, req.master_port
        if any(a.replica == 0 for a in req.assignments):
            first = self.replicas.get((req.job_id, req.attempt, 0))
            if first is not None and first.state.master_port:
                addr, port = first.state.master_addr, first.state.master_port
            else:
                addr, port = self.config.address, port or _free_port()
        for a in req.assignments:
            if (req.job_id, req.attempt, a.replica) not in self.replicas:
                self._start_replica(req, a.replica, a.gpus, addr, port)
        return AgentReply(ok=True, master_addr=addr, master_port=port)

    def stop(self, req: StopReplicas) -> AgentReply:
        now = self.clock.now()
        order = StopOrder(reason=req.reason, grace_s=req.grace_s, requested_at=now, kill_at=now + req.grace_s)
        mine = {k[2] for k in self.replicas if k[:2] == (req.job_id, req.attempt)}
        for index in sorted(mine | set(req.replicas)):
            replica = self.replicas.get((req.job_id, req.attempt, index))
            if replica is None:
                self._tombstone(req, index, order)
            elif replica.live:
                self._stop_replica(replica, order)
        return AgentReply(ok=True)

    def logs(self, req: LogsRequest) -> LogsChunk:
        replica = self.replicas.get((req.job_id, req.attempt, req.replica))
        directory = replica.directory if replica else self.store.directory(req.job_id, req.attempt, req.replica)
        found = (directory / "log").is_dir()
        data, start, end = read_log(directory / "log", req.offset, req.limit) if found else (b"", req.offset, 0)
        return LogsChunk(
            node=self.node, job_id=req.job_id, attempt=req.attempt, replica=req.replica, found=found, data=data,
            offset=start, next_offset=end if found else req.offset, running=replica is not None and replica.live,
        )  # fmt: skip

    # ---- starting and stopping -------------------------------------------------------------------------------

    def _start_replica(self, req: LaunchReplicas, index: int, gpus: list[int], addr: str, port: int) -> None:
        now = self.clock.now()
        directory = self.store.directory(req.job_id, req.attempt, index)
        visible = ",".join(self.config.gpus[i].uuid for i in gpus)
        state = ReplicaState(
            job_id=req.job_id, attempt=req.attempt, replica=index, replicas=req.replicas, gpus=list(gpus),
            visible_devices=visible, master_addr=addr, master_port=port, spawned_at=now,
        )  # fmt: skip
        replica = Replica(directory, state)
        self.replicas[state.key] = replica
        try:
            checkpoint = self.config.checkpoint_root / req.job_id
            checkpoint.mkdir(parents=True, exist_ok=True)
            env = self._environment(req, state, checkpoint)
            self.store.save(directory, state)
            _write_launch(directory, req, env, self._shim_settings())
            (directory / "lease").touch()
            state.shim_pid = spawn_shim(directory)
            state.shim_start = process_start(state.shim_pid)
        except OSError as exc:
            state.ending = Ending(exited_at=now, launch_error=f"cannot start the replica on {self.node}: {exc}")
            self._save(replica)
            self._changed()
            return
        self._save(replica)
        replica.watch = asyncio.create_task(self._watch(replica), name=f"replica-{req.job_id}-{index}")
        log.info("agent.replica_spawned", job_id=req.job_id, attempt=req.attempt, replica=index, gpus=visible)

    def _environment(self, req: LaunchReplicas, state: ReplicaState, checkpoint: Path) -> dict[str, str]:
        inherited = {
            k: v for k, v in os.environ.items() if k not in RESERVED_ENV and not k.startswith(RESERVED_PREFIXES)
        }
        torchrun = {  # torchrun reads its options from PET_* variables: `torchrun train.py` joins the gang as is
            "PET_NNODES": str(req.replicas), "PET_NODE_RANK": str(state.replica),
            "PET_MASTER_ADDR": state.master_addr, "PET_MASTER_PORT": str(state.master_port),
            "PET_NPROC_PER_NODE": str(len(state.gpus)),
        }  # fmt: skip
        chamber = {
            "CUDA_VISIBLE_DEVICES": state.visible_devices, "CHAMBER_JOB_ID": req.job_id,
            "CHAMBER_ATTEMPT": str(req.attempt), "CHAMBER_REPLICA": str(state.replica),
            "CHAMBER_REPLICAS": str(req.replicas), "CHAMBER_NODE": self.node, "CHAMBER_CHECKPOINT_DIR": str(checkpoint),
            "MASTER_ADDR": state.master_addr, "MASTER_PORT": str(state.master_port),
        }  # fmt: skip
        return inherited | torchrun | req.env | chamber

    def _shim_settings(self) -> dict[str, float | int]:
        timeout = self.config.timeout_s
        return {
            "log_max_bytes": self.config.log_max_bytes,
            "fence_after_s": FENCE_AFTER * timeout,
            "fence_grace_s": FENCE_GRACE * timeout,
        }

    def _tombstone(self, req: StopReplicas, index: int, order: StopOrder) -> None:
        state = ReplicaState(
            job_id=req.job_id, attempt=req.attempt, replica=index, replicas=0, gpus=[], stop=order,
            never_started=True, ending=Ending(exited_at=order.requested_at, message="stopped before it started"),
        )  # fmt: skip
        replica = Replica(self.store.directory(req.job_id, req.attempt, index), state)
        self.replicas[state.key] = replica
        self._save(replica)
        self._changed()

    def _stop_replica(self, replica: Replica, order: StopOrder) -> None:
        current = replica.state.stop
        if current is not None and current.kill_at <= order.kill_at:
            return  # already stopping, at least as soon
        if current is not None:
            order = msgspec.structs.replace(order, reason=current.reason, requested_at=current.requested_at)
        replica.state.stop = order
        self._save(replica)
        log.info("agent.replica_stopping", job_id=replica.state.job_id, replica=replica.state.replica,
                 grace_s=order.grace_s, reason=order.reason)  # fmt: skip
        if order.kill_at <= self.clock.now():
            self._kill(replica)
            return
        signal_group(replica.state.shim_pid, signal.SIGTERM)
        self._arm_kill(replica)

    def _arm_kill(self, replica: Replica) -> None:
        stop = replica.state.stop
        assert stop is not None
        if replica.kill_timer is not None:
            replica.kill_timer.cancel()
        delay = max(0.0, stop.kill_at - self.clock.now())
        replica.kill_timer = asyncio.get_running_loop().call_later(delay, self._kill, replica)

    def _kill(self, replica: Replica) -> None:
        if not replica.live or replica.state.stop is None:
            return
        replica.state.stop.killed = True
        self._save(replica)
        signal_group(replica.state.shim_pid, signal.SIGKILL)

    # ---- watching ---------------------------------------------------------------------------------------------

    async def _watch(self, replica: Replica) -> None:
        """Until the shim exits: note the start when the shim records it, then how the replica ended."""
        state = replica.state
        exited = asyncio.create_task(wait_exit(state.shim_pid))
        try:
            while state.started_at is None and not exited.done():
                self._read_started(replica)
                if state.started_at is None:
                    await asyncio.wait([exited], timeout=0.02)
            await exited
        finally:
            if not exited.done():
                exited.cancel()
        self._read_started(replica)
        self._ended(replica)

    def _read_started(self, replica: Replica) -> None:
        state = replica.state
        if state.started_at is not None:
            return
        started = read_json(replica.directory / "started.json")
        if started is None:
            return
        state.started_at = float(started.get("started_at", self.clock.now()))  # type: ignore[arg-type]
        state.child_pid = int(started.get("pid", 0))  # type: ignore[call-overload]
        self._save(replica)
        self._changed()

    def _ended(self, replica: Replica) -> None:
        """The shim is gone: how the replica ended, from the shim's record, else from what the agent knows."""
        state = replica.state
        if state.ending is not None:
            return
        if replica.kill_timer is not None:
            replica.kill_timer.cancel()
        record = read_json(replica.directory / "exit.json") or {}
        now = self.clock.now()
        at = float(record.get("exited_at", now))  # type: ignore[arg-type]
        if record.get("launch_error"):
            state.ending = Ending(exited_at=at, launch_error=f"cannot start on {self.node}: {record['launch_error']}")
        elif "exit_code" in record or "signal" in record:
            state.ending = Ending(
                exited_at=at, exit_code=_int(record.get("exit_code")), signal=_int(record.get("signal")),
                fenced=bool(record.get("fenced")),
            )  # fmt: skip
        elif state.stop is not None and state.stop.killed:
            state.ending = Ending(exited_at=now, signal=signal.SIGKILL)
        else:
            state.ending = Ending(exited_at=now, lost=True, message="its supervisor ended without recording an exit")
        log.info("agent.replica_ended", job_id=state.job_id, attempt=state.attempt, replica=state.replica,
                 exit_code=state.ending.exit_code, signal=state.ending.signal, lost=state.ending.lost)  # fmt: skip
        self._save(replica)
        self._changed()

    def _adopt(self) -> None:
        """After a restart: watch the replicas still running, settle the ones that ended meanwhile."""
        for directory, state in self.store.load_all():
            replica = Replica(directory, state)
            self.replicas[state.key] = replica
            if not replica.live:
                continue
            if alive(state.shim_pid, state.shim_start):
                replica.watch = asyncio.create_task(self._watch(replica), name=f"replica-{state.job_id}")
                if state.stop is not None:
                    if state.stop.killed or state.stop.kill_at <= self.clock.now():
                        self._kill(replica)
                    else:
                        self._arm_kill(replica)
                continue
            self._read_started(replica)
            if state.shim_pid == 0:
                state.ending = Ending(exited_at=self.clock.now(), launch_error="the agent stopped while starting it")
                self._save(replica)
            else:
                self._ended(replica)
        log.info("agent.adopted", node=self.node, replicas=len(self.replicas))

    # ---- reports and heartbeat ------------------------------------------------------------------------------

    def _changed(self) -> None:
        task = asyncio.create_task(self._flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _pending_reports(self, replica: Replica) -> list[tuple[str, msgspec.Struct]]:
        s, node = replica.state, self.node
        out: list[tuple[str, msgspec.Struct]] = []
        ending = s.ending
        if s.started_at is not None and "started" not in s.reported:
            out.append(("started", ReplicaStarted(
                node=node, job_id=s.job_id, attempt=s.attempt, replica=s.replica, pid=s.child_pid,
                started_at=s.started_at, visible_devices=s.visible_devices,
            )))  # fmt: skip
        if ending is not None and ending.launch_error and "failed" not in s.reported:
            out.append(("failed", ReplicaLaunchFailed(
                node=node, job_id=s.job_id, attempt=s.attempt, replica=s.replica, failed_at=ending.exited_at,
                reason=ending.launch_error,
            )))  # fmt: skip
        elif ending is not None and not ending.launch_error and "exited" not in s.reported:
            out.append(("exited", ReplicaExited(
                node=node, job_id=s.job_id, attempt=s.attempt, replica=s.replica, exited_at=ending.exited_at,
                exit_code=ending.exit_code, signal=ending.signal, stop_requested=s.stop is not None or ending.fenced,
                lost=ending.lost, message=ending.message or ("stopped: its agent was gone" if ending.fenced else ""),
            )))  # fmt: skip
        return out

    async def _flush(self) -> None:
        """Publish every report not yet acknowledged, in order per replica; mark each once JetStream has it."""
        async with self._flushing:
            for replica in list(self.replicas.values()):
                s = replica.state
                for what, report in self._pending_reports(replica):
                    try:
                        await self.bus.publish(
                            self.bus.names.replica_reports(s.job_id), report,
                            msg_id=f"{s.job_id}:{s.attempt}:{s.replica}:{what}",
                        )  # fmt: skip
                    except PublishError as exc:
                        log.warning("agent.report_failed", job_id=s.job_id, what=what, error=str(exc))
                        return
                    s.reported.append(what)
                    self._save(replica)

    async def _beat(self) -> None:
        while not self._stop.is_set():
            now = self.clock.now()
            live = self.live()
            status = AgentStatus(
                node=self.node, at=now, started_at=self.started_at, address=self.config.address,
                replicas=[
                    RunningReplica(job_id=r.state.job_id, attempt=r.state.attempt, replica=r.state.replica,
                                   pid=r.state.child_pid, gpus=r.state.gpus)
                    for r in live
                ],
            )  # fmt: skip
            try:
                await self.bus.publish_nowait(self.bus.names.agent_status(self.node), status)
            except PublishError as exc:
                log.warning("agent.heartbeat_failed", node=self.node, error=str(exc))
            if self.bus.nc.is_connected:
                for r in live:
                    with contextlib.suppress(OSError):
                        (r.directory / "lease").touch()
            await self._flush()
            if now - self._last_gc >= GC_EVERY_S:
                self._last_gc = now
                self._collect_garbage(now)
            await wait_event(self._stop, self.config.heartbeat_s)

    def _collect_garbage(self, now: float) -> None:
        """Forget replicas that ended, were reported, and are older than the retention (their output too)."""
        for key, r in list(self.replicas.items()):
            ending = r.state.ending
            if ending is None or ending.exited_at > now - self.config.retention_s or self._pending_reports(r):
                continue
            self.store.remove(r.directory)
            del self.replicas[key]

    def _save(self, replica: Replica) -> None:
        try:
            self.store.save(replica.directory, replica.state)
        except OSError as exc:
            log.error("agent.state_write_failed", directory=str(replica.directory), error=str(exc))


def _write_launch(directory: Path, req: LaunchReplicas, env: dict[str, str], settings: dict[str, float | int]) -> None:
    spec = {"argv": req.command, "env": env, "cwd": req.working_dir, **settings}
    fd = os.open(directory / "launch.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(spec))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None


async def _respond(msg: Any, reply: msgspec.Struct) -> None:
    if not msg.reply:
        return
    try:
        await msg.respond(encode(reply))
    except Exception as exc:  # the requester is gone or the connection broke: it will ask again
        log.warning("agent.reply_failed", subject=msg.subject, error=repr(exc))
