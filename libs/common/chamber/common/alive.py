"""A service's liveness, as a file its event loop touches: what a Kubernetes liveness probe (or a supervisor) reads.

A service whose event loop stops turning (a call that blocks it, as a hung NVML call can, or a deadlock) does
nothing more, yet its process lives on, and nothing restarts it. With `CHAMBER_ALIVE_FILE` set, `run_service`
keeps a task on the loop that touches that file every `INTERVAL_S` (`beat`); the probe, `python -m
chamber.common.alive FILE MAX_AGE_S`, fails when the file was not touched for `MAX_AGE_S` (or does not exist), and
the kubelet restarts the container. It imports nothing but the standard library, so the kubelet's exec costs
tens of milliseconds, not the second a `chamber` command takes to import.

Only the loop is judged, not the service's connections: a service that lost NATS or Redis reconnects on its own, and
restarting it would not bring them back sooner (and would turn an outage of NATS into a crash loop of every pod).
"""

import asyncio
import sys
import time
from pathlib import Path

INTERVAL_S = 5.0
"""How often the file is touched; a probe's MAX_AGE_S should be several of these (the chart's is 30)."""


def touch(path: Path) -> None:
    """Mark the service alive now (the file is made if missing, its time set if not)."""
    path.touch(exist_ok=True)


async def beat(path: Path, interval_s: float = INTERVAL_S) -> None:
    """Touch `path` every `interval_s` while the event loop turns (until cancelled). A file that cannot be written
    is not fatal to the service: the probe then fails, and says why in the container's events."""
    while True:
        try:
            touch(path)
        except OSError as exc:
            print(f"chamber: cannot touch the liveness file {path}: {exc}", file=sys.stderr)
        await asyncio.sleep(interval_s)


def age_s(path: Path, now: float | None = None) -> float | None:
    """Seconds since `path` was last touched; None if it does not exist."""
    try:
        touched = path.stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - touched)


def check(path: Path, max_age_s: float, now: float | None = None) -> str | None:
    """None when the service touched `path` within `max_age_s`; else why it is not alive."""
    age = age_s(path, now)
    if age is None:
        return f"{path} does not exist: the service has not started its event loop (or CHAMBER_ALIVE_FILE differs)"
    if age > max_age_s:
        return f"{path} last touched {age:.0f} s ago (more than {max_age_s:g} s): the service's event loop is stuck"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m chamber.common.alive FILE MAX_AGE_S", file=sys.stderr)
        return 2
    try:
        max_age_s = float(argv[1])
    except ValueError:
        print(f"MAX_AGE_S must be a number of seconds, not {argv[1]!r}", file=sys.stderr)
        return 2
    problem = check(Path(argv[0]), max_age_s)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
