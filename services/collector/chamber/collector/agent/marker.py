"""How a replica's processes are found whatever session or process group they move to: a marker in their
environment (`MARKER`), set by the agent and inherited by everything the command starts. torchrun starts each of
its workers in a session of its own, out of the shim's process group: signalling the group alone let them run on,
unsupervised, on GPUs already given to another job. Small on purpose: the shim imports it before it starts the
command."""

import contextlib
import os
from pathlib import Path

MARKER = "CHAMBER_REPLICA_KEY"
"""Set in every replica's environment (`replica_marker`), inherited by everything the command starts. A process
that leaves the shim's process group (a new session: torchrun starts every worker that way; a double fork)
still carries it, so stopping, killing and "is anything left" find it by the marker, not by the group alone."""


def replica_marker(job_id: str, attempt: int, replica: int) -> str:
    return f"{job_id}:{attempt}:{replica}"


def marked(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment carries `MARKER=marker` (readable: the agent's own user's, or
    any as root)."""
    needle = f"\0{MARKER}={marker}\0".encode()
    found = []
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in b"\0" + environ + b"\0" and not zombie(pid):
            found.append(pid)
    return found


def marker_of(pid: int) -> str:
    """The replica marker in process `pid`'s environment (empty: none, or not readable)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return ""
    prefix = f"{MARKER}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "replace")
    return ""


def signal_marked(marker: str, sig: int, outside_group: int = 0) -> None:
    """`sig` to every process carrying the marker; with `outside_group`, only to those not in that process group
    (which is signalled as a whole: a process must not get the same SIGTERM twice)."""
    for pid in marked(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if outside_group and os.getpgid(pid) == outside_group:
                continue
            os.kill(pid, sig)


def zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
