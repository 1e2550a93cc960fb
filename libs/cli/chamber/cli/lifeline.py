"""Children that die with their parent: `python -m chamber.cli.lifeline <parent-pid> <program> <args...>`.

`chamber up` starts every service and the embedded nats-server and valkey through this small launcher. On Linux
it asks the kernel (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) to kill the process the moment its parent dies, then
`exec`s the real program, which keeps that setting. So even a SIGKILLed `chamber up`, which cannot clean up,
leaves no service holding ports, no nats-server and no valkey behind. The launcher checks that its parent is
still the one it was given after the `prctl`, closing the window in which the parent could die before it.

Why a launcher and not `preexec_fn`: code run between fork and exec is unsafe once the parent has threads
(asyncio's child watcher and `to_thread` have them); an `exec`ed launcher has no such window.

Elsewhere (macOS) there is no parent-death signal: the launcher only checks the parent and `exec`s.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent exits; exit now if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(1)


def wrap(argv: list[str], parent_pid: int | None = None) -> list[str]:
    """The command line that runs `argv` through the launcher, tied to `parent_pid` (default: this process)."""
    pid = os.getpid() if parent_pid is None else parent_pid
    return [sys.executable, "-m", "chamber.cli.lifeline", str(pid), *argv]


def main(args: list[str]) -> None:
    if len(args) < 2 or not args[0].isdigit():
        sys.exit("usage: python -m chamber.cli.lifeline <parent-pid> <program> [args...]")
    die_with_parent(int(args[0]))
    os.execvp(args[1], args[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
