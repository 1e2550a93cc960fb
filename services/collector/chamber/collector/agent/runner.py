"""The replicas of one node as processes: started, stopped, watched, re-adopted (no bus here: `server.py` puts
this on NATS).

- **Launch**: each replica placed here gets a directory, a state file and a shim, which starts the command in a
  new process group with `CUDA_VISIBLE_DEVICES` set to the placed GPUs' UUIDs and the gang's variables. A replica
  that exists is not started again, so a repeated launch is harmless.
- **Stop**: SIGTERM to each group, SIGKILL when the grace ends. The order is kept in the state file, so an agent
  restarted during the grace still kills on time. A stop for a replica that never launched here leaves a
  tombstone: a late launch will not start it.
- **Watch**: the shim's start record, then its exit (a pidfd wakes at once); **adopt** after a restart: the live
  replicas are watched again, the ones that ended meanwhile are settled from their records.
- **A shim gone** (however: a recorded exit, or killed by the OOM killer or kill -9 without a record): whatever is
  left of its process group is killed, and the replica is reported exited only once the group is gone (or after
  `group_exit_s`), so the GPUs the scheduler then frees are free: the command's dead-man switch was the shim.
Every change is saved to the state file before anything depends on it, and `on_change` is called so the server
sends the reports it implies.
"""

import asyncio
import contextlib
import os
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import msgspec

from chamber.collector.agent.launching import free_port, replica_environment, write_launch
from chamber.collector.agent.logfiles import read_log
from chamber.collector.agent.marker import marker_of, signal_marked
from chamber.collector.agent.replicas import (
    Ending,
    ReplicaState,
    ReplicaStore,
    StopOrder,
    alive,
    group_alive,
    kill_group,
    process_start,
    read_json,
    signal_shim_group,
    spawn_shim,
    wait_exit,
)
from chamber.collector.agent.reports import ending_from, pending_reports
from chamber.common.clock import Clock
from chamber.common.contracts import (
    AgentReply,
    GpuDevice,
    LaunchReplicas,
    LogsChunk,
    LogsRequest,
    StopReplicas,
)
from chamber.common.log import get_logger

log = get_logger(__name__)


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
    group_exit_s: float = 10.0
    """How long the exit of a replica whose shim is gone waits for the rest of its process group to die."""


BEFORE_START = "stopped before it started"


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
    def __init__(self, clock: Clock, config: RunnerConfig, on_change: Callable[[], None] = lambda: None) -> None:
        self.clock = clock
        self.config = config
        self.node = config.node
        self.store = ReplicaStore(config.root)
        self.replicas: dict[tuple[str, int, int], Replica] = {}
        self.on_change = on_change
        self._scans: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        """Signals to a replica's processes outside its group, found by a scan of every process's environment: off
        the event loop (a read of a process stuck in the driver can block, and heartbeats must go on), in order
        (one thread: a SIGTERM is never sent after the SIGKILL that followed it), on a daemon thread (a stuck scan
        must not hold up the agent's exit; a restarted agent sends a recorded kill again)."""
        threading.Thread(target=self._scan, name="agent-marker-scan", daemon=True).start()

    async def close(self) -> None:
        """Stop watching; the replicas keep running (a restarted agent adopts them)."""
        for replica in self.replicas.values():
            if replica.kill_timer is not None:
                replica.kill_timer.cancel()
            if replica.watch is not None:
                replica.watch.cancel()
        await asyncio.gather(*(r.watch for r in self.replicas.values() if r.watch), return_exceptions=True)
        self._scans.put(None)  # what is queued is still sent, then the thread ends

    def _scan(self) -> None:
        while (work := self._scans.get()) is not None:
            try:
                work()
            except Exception:
                log.exception("agent.signal_failed")

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.live]

    def owner(self, pid: int, gpu_index: int) -> str:
        """The job whose replica on GPU `gpu_index` process `pid` belongs to (by its session, else by the replica
        marker in its environment: torchrun's workers start sessions of their own); empty: none."""
        try:
            session = os.getsid(pid)
        except OSError:
            return ""
        for r in self.replicas.values():
            if r.live and r.state.shim_pid == session and gpu_index in r.state.gpus:
                return r.state.job_id
        marker = marker_of(pid)
        for r in self.replicas.values():
            if r.live and marker == r.state.marker and gpu_index in r.state.gpus:
                return r.state.job_id
        return ""

    # ---- requests (idempotent) --------------------------------------------------------------------------------

    def launch(self, req: LaunchReplicas) -> AgentReply:
        gpus = {g.index for g in self.config.gpus}
        if not req.command:
            return AgentReply(ok=False, error="nothing to run: the job has no command")
        for a in req.assignments:
            bad = [i for i in a.gpus if i not in gpus]
            if bad:
                return AgentReply(ok=False, error=f"replica {a.replica}: no GPU {bad} on {self.node}")
        addr, port = req.master_addr, req.master_port
        if any(a.replica == 0 for a in req.assignments):
            first = self.replicas.get((req.job_id, req.attempt, 0))
            if first is not None and first.state.master_port:
                addr, port = first.state.master_addr, first.state.master_port
            else:
                addr, port = self.config.address, port or free_port()
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
        uuids = {g.index: g.uuid for g in self.config.gpus}
        visible = ",".join(uuids[i] for i in gpus)
        state = ReplicaState(
            job_id=req.job_id, attempt=req.attempt, replica=index, replicas=req.replicas, gpus=list(gpus),
            visible_devices=visible, master_addr=addr, master_port=port, spawned_at=now,
        )  # fmt: skip
        replica = Replica(directory, state)
        self.replicas[state.key] = replica
        try:
            checkpoint = self.config.checkpoint_root / req.job_id
            checkpoint.mkdir(parents=True, exist_ok=True)
            env = replica_environment(dict(os.environ), req, state, self.node, checkpoint)
            self.store.save(directory, state)
            write_launch(directory, req, env, self.config.log_max_bytes, self.config.timeout_s)
            (directory / "lease").touch()
            state.shim_pid = spawn_shim(directory)
            state.shim_start = process_start(state.shim_pid)
        except (OSError, ValueError) as exc:  # (ValueError: a path the OS cannot take, as with a NUL in it)
            state.ending = Ending(exited_at=now, launch_error=f"cannot start the replica on {self.node}: {exc}")
            self.save(replica)
            self.on_change()
            return
        self.save(replica)
        replica.watch = asyncio.create_task(self._watch(replica), name=f"replica-{req.job_id}-{index}")
        log.info("agent.replica_spawned", job_id=req.job_id, attempt=req.attempt, replica=index, gpus=visible)

    def _tombstone(self, req: StopReplicas, index: int, order: StopOrder) -> None:
        state = ReplicaState(
            job_id=req.job_id, attempt=req.attempt, replica=index, replicas=0, gpus=[], stop=order,
            never_started=True,
            ending=Ending(exited_at=order.requested_at, message=": ".join(filter(None, (BEFORE_START, req.reason)))),
        )  # fmt: skip
        replica = Replica(self.store.directory(req.job_id, req.attempt, index), state)
        self.replicas[state.key] = replica
        self.save(replica)
        self.on_change()

    def _stop_replica(self, replica: Replica, order: StopOrder) -> None:
        current = replica.state.stop
        if current is not None and current.kill_at <= order.kill_at:
            return  # already stopping, at least as soon
        if current is not None:
            order = msgspec.structs.replace(order, reason=current.reason, requested_at=current.requested_at)
        replica.state.stop = order
        self.save(replica)
        log.info("agent.replica_stopping", job_id=replica.state.job_id, replica=replica.state.replica,
                 grace_s=order.grace_s, reason=order.reason)  # fmt: skip
        if order.kill_at <= self.clock.now():
            self._kill(replica)
            return
        if current is None:  # a repeated, shorter order only moves the kill earlier: one SIGTERM per stop
            self._signal(replica, signal.SIGTERM)
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
        self.save(replica)
        self._signal(replica, signal.SIGKILL)

    def _signal(self, replica: Replica, sig: int) -> None:
        """`sig` to the shim's process group at once (unless its pid now runs another process: a stop that comes
        while a replica whose shim is gone settles), and to the replica's processes outside it (see `_scans`)."""
        pgid, marker = replica.state.shim_pid, replica.state.marker
        signal_shim_group(pgid, replica.state.shim_start, sig)
        if marker:
            self._scans.put(partial(signal_marked, marker, sig, pgid))

    # ---- watching ---------------------------------------------------------------------------------------------

    async def _watch(self, replica: Replica) -> None:
        """Until the shim exits: note the start when the shim records it, then how the replica ended."""
        state = replica.state
        exited = asyncio.create_task(wait_exit(state.shim_pid, on_exit=lambda: self._kill_leftovers(replica)))
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
        await self._settle(replica)

    def _kill_leftovers(self, replica: Replica) -> None:
        """The shim is gone: its group goes too (the shim itself ends by killing it; one that died without that
        leaves the command running, unsupervised, at once (the shim is not reaped yet, so its pid is not reused),
        and whatever carries the replica's marker outside it, off the event loop (see `_scans`)."""
        state = replica.state
        kill_group(state.shim_pid, state.shim_start)
        if state.marker:
            self._scans.put(partial(signal_marked, state.marker, signal.SIGKILL))

    async def _settle(self, replica: Replica) -> None:
        """Once the shim's group is gone (or `group_exit_s` passed): the replica ended."""
        state = replica.state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.group_exit_s
        # Off the event loop (a scan reads every process's environment; one stuck in the driver could block a read)
        # and a little apart: heartbeats and lease touches must not wait on it.
        while await asyncio.to_thread(group_alive, state.shim_pid, state.shim_start, state.marker):
            if loop.time() >= deadline:
                log.error("agent.replica_group_survived", job_id=state.job_id, attempt=state.attempt,
                          replica=state.replica, pgid=state.shim_pid, waited_s=self.config.group_exit_s)  # fmt: skip
                break
            await asyncio.sleep(0.2)
            await asyncio.to_thread(kill_group, state.shim_pid, state.shim_start, state.marker)
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
        self.save(replica)
        self.on_change()

    def _ended(self, replica: Replica) -> None:
        """The shim is gone: how the replica ended, from the shim's record, else from what the agent knows."""
        state = replica.state
        if state.ending is not None:
            return
        if replica.kill_timer is not None:
            replica.kill_timer.cancel()
        state.ending = ending_from(read_json(replica.directory / "exit.json"), state, self.node, self.clock.now())
        log.info("agent.replica_ended", job_id=state.job_id, attempt=state.attempt, replica=state.replica,
                 exit_code=state.ending.exit_code, signal=state.ending.signal, lost=state.ending.lost)  # fmt: skip
        self.save(replica)
        self.on_change()

    def adopt(self) -> None:
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
                kill_group(0, "", state.marker)  # a command started just before the agent died, not yet recorded
                state.ending = Ending(exited_at=self.clock.now(), launch_error="the agent stopped while starting it")
                self.save(replica)
                continue
            self._kill_leftovers(replica)
            if group_alive(state.shim_pid, state.shim_start, state.marker):
                replica.watch = asyncio.create_task(self._settle(replica), name=f"replica-{state.job_id}")
            else:
                self._ended(replica)
        log.info("agent.adopted", node=self.node, replicas=len(self.replicas))

    def touch_leases(self) -> None:
        """The dead-man switch: the agent is here and connected (see the shim)."""
        for r in self.live():
            with contextlib.suppress(OSError, ValueError):
                (r.directory / "lease").touch()

    def collect_garbage(self, now: float) -> None:
        """Forget replicas that ended, were reported, and are older than the retention (their output too)."""
        for key, r in list(self.replicas.items()):
            ending = r.state.ending
            if (
                ending is None
                or ending.exited_at > now - self.config.retention_s
                or pending_reports(self.node, r.state)
            ):
                continue
            self.store.remove(r.directory)
            del self.replicas[key]

    def save(self, replica: Replica, *, durable: bool = True) -> None:
        """`durable=False` for what may be lost to a power cut (which reports went out: they are sent again, and
        JetStream drops the repeats), so that fsync, which can take long under heavy checkpoint writes, is not in
        the event loop's way for each one."""
        try:
            self.store.save(replica.directory, replica.state, durable=durable)
        except OSError as exc:
            log.error("agent.state_write_failed", directory=str(replica.directory), error=str(exc))
