"""A replica on disk and as a process: its state file, its directory, and the few process calls the agent makes.

One directory per replica and attempt (`<root>/replicas/<job>/<attempt>/<replica>/`): `state.json` (the agent's
record: GPUs, the shim's pid, a requested stop, how it ended, which reports were acknowledged), `launch.json`
(what the shim runs), `started.json` and `exit.json` (written by the shim), `lease` (the dead-man switch) and
`log/`. Everything the agent needs after a restart is there, so it re-adopts live replicas and reports the ones
that ended while it was away.
"""

import asyncio
import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from chamber.collector.agent.atomic import write_atomically
from chamber.collector.agent.marker import marked, replica_marker, signal_marked, zombie
from chamber.common.log import get_logger

log = get_logger(__name__)

STATE = "state.json"


class StopOrder(msgspec.Struct, kw_only=True):
    reason: str
    grace_s: float
    requested_at: float
    kill_at: float
    killed: bool = False
    """SIGKILL was sent to the group (a shim killed with it cannot record the exit itself)."""


class Ending(msgspec.Struct, kw_only=True):
    exited_at: float
    exit_code: int | None = None
    signal: int | None = None
    lost: bool = False
    launch_error: str = ""
    fenced: bool = False
    message: str = ""


class ReplicaState(msgspec.Struct, kw_only=True):
    job_id: str
    attempt: int
    replica: int
    replicas: int
    gpus: list[int]
    visible_devices: str = ""
    master_addr: str = ""
    master_port: int = 0
    spawned_at: float = 0.0
    shim_pid: int = 0
    shim_start: str = ""
    """The shim's start time as the kernel records it, so a recycled pid is not taken for the shim."""
    started_at: float | None = None
    child_pid: int = 0
    stop: StopOrder | None = None
    ending: Ending | None = None
    reported: list[str] = msgspec.field(default_factory=list)
    """Reports JetStream acknowledged: `started`, `exited`, `failed`."""
    never_started: bool = False
    """Stopped before any launch reached this node: it must never start (a late launch is refused)."""

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.replica)

    @property
    def marker(self) -> str:
        """The value of `MARKER` in this replica's processes."""
        return replica_marker(self.job_id, self.attempt, self.replica)


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ReplicaState)


class ReplicaStore:
    """The replica directories of one node."""

    def __init__(self, root: Path) -> None:
        self.root = root / "replicas"

    def directory(self, job_id: str, attempt: int, replica: int) -> Path:
        return self.root / job_id / str(attempt) / str(replica)

    def save(self, directory: Path, state: ReplicaState, *, durable: bool = True) -> None:
        """Atomically, and durably unless told otherwise: the file is on disk before it replaces the old one (a
        power loss must not leave an empty state file, which would make the agent forget a running replica)."""
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(directory / STATE, _encoder.encode(state), durable=durable)

    def load_all(self) -> list[tuple[Path, ReplicaState]]:
        found = []
        for path in sorted(self.root.glob(f"*/*/*/{STATE}")):
            try:
                found.append((path.parent, _decoder.decode(path.read_bytes())))
            except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                # Its key is in its path: whatever of it still runs is killed (nothing supervises it any more).
                job_id, attempt, replica = path.parent.parts[-3:]
                log.error("agent.bad_state_file", path=str(path), error=str(exc))
                if attempt.isdigit() and replica.isdigit():
                    signal_marked(replica_marker(job_id, int(attempt), int(replica)), signal.SIGKILL)
        return found

    def remove(self, directory: Path) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        for parent in (directory.parent, directory.parent.parent):
            with contextlib.suppress(OSError):
                parent.rmdir()  # only when empty


def read_json(path: Path) -> dict[str, object] | None:
    try:
        value = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    return value if isinstance(value, dict) else None


def spawn_shim(directory: Path) -> int:
    """Start the shim for the replica in `directory` as the leader of a new session (and process group)."""
    argv = [sys.executable, "-m", "chamber.collector.agent.shim", str(directory)]
    shim_log = os.open(directory / "shim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return os.posix_spawn(
            sys.executable, argv, dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, shim_log, 1),
                (os.POSIX_SPAWN_DUP2, shim_log, 2),
            ],
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM),
            setsigmask=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP),  # until the shim's handler is in place
        )  # fmt: skip
    finally:
        os.close(shim_log)


def process_start(pid: int) -> str:
    """The kernel's start time of `pid` (Linux `/proc`); empty where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def alive(pid: int, start: str) -> bool:
    """`pid` still runs and is the process that started at `start` (not a recycled pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if start and process_start(pid) not in ("", start):
        return False
    return not zombie(pid)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_shim_group(pgid: int, start: str, sig: int) -> None:
    """`sig` to the process group of the shim `pgid` (its pid) that started at `start`. Not when that pid now runs
    another process (`start` differs): the shim's group is gone and the pid reused, perhaps by the leader of another
    group. While any member of the group lives, the kernel does not reuse its id, so a group that is found is the
    shim's."""
    if pgid <= 0 or (start and process_start(pgid) not in ("", start)):
        return
    signal_group(pgid, sig)


def kill_group(pgid: int, start: str, marker: str = "") -> None:
    """SIGKILL what is left of the process group of a shim that is gone (`pgid` is the shim's pid, see
    `signal_shim_group`), and every process carrying the replica's `marker`."""
    if marker:
        signal_marked(marker, signal.SIGKILL)
    signal_shim_group(pgid, start, signal.SIGKILL)


def group_alive(pgid: int, start: str, marker: str = "") -> bool:
    """Some process of the group of the shim `pgid` (started at `start`), or carrying the replica's `marker`, still
    runs; a zombie does not count (it holds no memory, on no GPU), nor the group of another process that now has
    the shim's pid."""
    if marker and marked(marker):
        return True
    if pgid <= 0 or (start and process_start(pgid) not in ("", start)):
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


async def wait_exit(pid: int, poll_s: float = 0.2, on_exit: Callable[[], None] = lambda: None) -> None:
    """Until `pid` exits: a pidfd where the kernel offers one (woken at once, for any process), else polling.
    `on_exit` runs once it has exited, before a child of this process is reaped (so its pid is not reused yet);
    then it is reaped, so no zombie is left."""
    loop = asyncio.get_running_loop()
    fd = -1
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        on_exit()
        _reap(pid)
        return
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        on_exit()
        _reap(pid)
        return
    while alive(pid, ""):  # noqa: ASYNC110 - no event tells of another process's exit here (a zombie has exited)
        await asyncio.sleep(poll_s)
    on_exit()
    _reap(pid)


def _reap(pid: int) -> bool:
    """Collect the exit of a child of this process; True when it has exited."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return waited == pid
