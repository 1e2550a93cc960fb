"""The supervisor of one replica: `python -m chamber.collector.agent.shim <replica-dir>`.

The agent starts it as the leader of a new session and process group; it starts the replica's command in that
group, writes its output to rotated segments, and records how it ended in `exit.json`. So a replica outlives an
agent that crashes or restarts, its exit code is not lost when nobody is its parent, and the whole group (the
command and anything it forked) can be signalled at once. It ignores SIGTERM itself: a stop signals the group,
and the shim stays to record the exit.

A dead-man switch: the agent touches `lease` at every heartbeat it can publish. When the lease is older than
`fence_after_s` (the agent is gone or cut off, and the scheduler will soon count the replica as lost and give its
GPUs away), the shim stops the group itself: SIGTERM, `fence_grace_s`, SIGKILL.

A shim that cannot write (a full disk) keeps supervising: output it cannot write is dropped and counted (a note
says how much, once writing works again), and an exit it cannot record still ends with the group killed. A shim
that dies anyway (the OOM killer, kill -9) leaves its group to the agent, which kills it (see `runner.py`).

Standard library only, as it starts once per replica.
"""

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chamber.collector.agent.atomic import write_atomically
from chamber.collector.agent.logfiles import LogWriter
from chamber.collector.agent.marker import MARKER, signal_marked

POLL_S = 0.25


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Atomically and durably (`write_atomically`): a reader sees the old content or the new, never half, and never
    an empty file after a power loss."""
    write_atomically(path, json.dumps(value).encode())


def _record(path: Path, value: dict[str, Any]) -> None:
    """`write_json`, where a failure (a full disk) is noted on stderr (`shim.log`), not fatal: the agent then
    takes the replica's end as unrecorded."""
    try:
        write_json(path, value)
    except OSError as exc:
        with contextlib.suppress(OSError):
            print(f"chamber shim: cannot write {path.name}: {exc}", file=sys.stderr, flush=True)


class Output:
    """The replica's log, where a write that fails (ENOSPC, EIO) costs the output, not the supervisor."""

    def __init__(self, writer: LogWriter) -> None:
        self.writer = writer
        self.dropped = 0
        """Bytes of output dropped since the last write that worked."""
        self.error = ""

    def write(self, data: bytes) -> None:
        try:
            if self.dropped:
                self.writer.write(f"\nchamber: {self.dropped} bytes of output dropped: {self.error}\n".encode())
                self.dropped = 0
            self.writer.write(data)
        except OSError as exc:
            self.dropped += len(data)
            self.error = exc.strerror or str(exc)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""Blocked from the shim's exec (the agent spawns it with them masked) until its handler is in place: a stop that
came in the first instants used to kill the shim itself, and the replica was reported lost, not stopped."""
_early_stop: list[int] = []


def _ignore(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: an ignored signal would stay ignored in the command after exec. A SIGTERM before the
    command exists is kept and passed on to it once it does."""
    _early_stop.append(signum)


def _lease_age(directory: Path, started: float) -> float:
    try:
        return time.time() - (directory / "lease").stat().st_mtime
    except FileNotFoundError:
        return time.time() - started


def _pump(fd: int, log: Output) -> bool:
    """Copy what the command wrote; True at end of output."""
    while True:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            return True
        log.write(data)


def _others_in_group() -> bool:
    """Whether a process of the shim's group other than itself runs (a zombie does not count)."""
    me, group = os.getpid(), os.getpgid(0)
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return False
    for pid in pids:
        if pid == me:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(group):
            return True
    return False


def run(directory: Path) -> int:
    spec = json.loads((directory / "launch.json").read_text())
    marker = str(spec["env"].get(MARKER, ""))
    for signum in STOP_SIGNALS:
        signal.signal(signum, _ignore)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a pending stop is delivered (and kept) now
    log = Output(LogWriter(directory / "log", int(spec["log_max_bytes"])))
    started = time.time()
    try:
        child = subprocess.Popen(
            spec["argv"], env=spec["env"], cwd=spec.get("cwd"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        log.write(f"chamber: cannot start {spec['argv'][0]!r}: {exc}\n".encode())
        log.close()
        write_json(directory / "exit.json", {"launch_error": str(exc), "exited_at": time.time()})
        return 127
    write_json(directory / "started.json", {"pid": child.pid, "started_at": time.time()})
    if signal.SIGTERM in _early_stop:  # the stop came before the command existed: it gets it now
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)
    assert child.stdout is not None
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    fence_after = float(spec.get("fence_after_s") or 0)
    fenced_at: float | None = None
    eof = False
    while (rc := child.poll()) is None:
        if eof:
            time.sleep(POLL_S)
        elif selector.select(timeout=POLL_S):
            eof = _pump(fd, log)
        if fence_after and fenced_at is None and _lease_age(directory, started) > fence_after:
            fenced_at = time.time()
            log.write(b"\nchamber: the node agent is gone; stopping this replica (SIGTERM)\n")
            signal_marked(marker, signal.SIGTERM, outside_group=os.getpgid(0))
            os.killpg(0, signal.SIGTERM)
        if fenced_at is not None and time.time() - fenced_at >= float(spec.get("fence_grace_s") or 0):
            _record(directory / "exit.json", {"signal": signal.SIGKILL, "fenced": True, "exited_at": time.time()})
            log.close()
            signal_marked(marker, signal.SIGKILL)
            os.killpg(0, signal.SIGKILL)
    if not eof:
        eof = _pump(fd, log)
    code: int | None = rc if rc >= 0 else None
    sig: int | None = -rc if rc < 0 else None
    _record(
        directory / "exit.json",
        {"exit_code": code, "signal": sig, "fenced": fenced_at is not None, "exited_at": time.time()},
    )
    if _early_stop or fenced_at is not None:
        # Stopped: the command's first process ended, but the rest of its group may still be checkpointing (a
        # `sh -c "... && python train.py"` wrapper dies on the SIGTERM at once, while the trainer saves). They have
        # until the agent's SIGKILL at the grace's end (the fence's own grace when fenced), not until now (found
        # by review: a wrapped trainer was killed 0.2 s into a 10 s grace, its checkpoint never written).
        grace = float(spec.get("fence_grace_s") or 0)
        while _others_in_group() and (fenced_at is None or time.time() - fenced_at < grace):
            if eof:
                time.sleep(POLL_S)
            elif selector.select(timeout=POLL_S):
                eof = _pump(fd, log)
    log.close()
    signal_marked(marker, signal.SIGKILL)  # what the command left behind outside its group (a new session)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(0, signal.SIGKILL)  # whatever the command left behind in its group goes with it (and the shim)
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
