"""Service processes for end-to-end tests: started as `chamber service <name>`, killable like in production."""

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import BinaryIO

from chamber.common.settings import Settings


class ServiceProcesses:
    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.env = {**os.environ, **settings.to_env(), "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}
        self._logs: list[BinaryIO] = []

    def start(self, name: str) -> None:
        n = self.starts.get(name, 0) + 1
        self.starts[name] = n
        log = open(self.log_dir / f"{name}.{n}.log", "wb")  # noqa: SIM115 - closed in stop_all
        self._logs.append(log)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "chamber.cli.main", "service", name], env=self.env, stdout=log, stderr=log
        )

    def kill(self, name: str) -> None:
        """SIGKILL: no clean shutdown, nothing flushed, like a crashed pod."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = None
        self.procs.clear()
        for log in self._logs:
            log.close()
        return codes

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.log_dir.glob("*.log")))


def children(pid: int) -> list[int]:
    """The direct children of a process (Linux: /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children(child)
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def service_pids(supervisor_pid: int) -> dict[str, int]:
    """The pid of each service a `chamber up` runs, by name (from their command lines)."""
    pids: dict[str, int] = {}
    for pid in children(supervisor_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        argv = [a for a in argv if a]
        if len(argv) >= 2 and argv[-2] == "service" and alive(pid):
            pids[argv[-1]] = pid
    return pids
