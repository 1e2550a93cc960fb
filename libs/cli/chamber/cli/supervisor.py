"""`chamber up`: every service as its own process (as in a cluster), restarted if it dies, stopped on Ctrl-C."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from chamber.cli.infra import Infra

SERVICES = ("collector", "scheduler", "health", "quota", "gateway")


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    started_at: float
    restarts: int = 0


def spawn(name: str, env: dict[str, str], argv: list[str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "chamber.cli.main", *(argv or ["service", name])], env=env)


def wait_ready(url: str, children: list[Child], timeout_s: float = 30.0) -> bool:
    """Poll the gateway's /healthz until it answers 200 (or a child dies, or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(c.proc.poll() is not None for c in children):
            return False
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


def supervise(
    infra: Infra,
    env_overrides: dict[str, str],
    api_url: str,
    started: float,
    *,
    out: Callable[[str], None] = print,
    extra: dict[str, list[str]] | None = None,
) -> int:
    """`extra`: more children (name -> `chamber` arguments) started before the services, e.g. the emulated
    Kubernetes API of `chamber up --kube-emulator`."""
    env = {**os.environ, **env_overrides, "CHAMBER_NATS_URL": infra.nats_url, "CHAMBER_REDIS_URL": infra.redis_url}
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    extra = extra or {}
    children = [Child(name, spawn(name, env, argv), time.monotonic()) for name, argv in extra.items()]
    children += [Child(name, spawn(name, env), time.monotonic()) for name in SERVICES]
    try:
        if wait_ready(api_url, children):
            out(f"chamber: ready in {time.monotonic() - started:.1f} s: API at {api_url}; Ctrl-C stops everything")
        else:
            out("chamber: the API did not become ready; see the service logs above")
        while not stopping:
            time.sleep(0.2)
            for child in children:
                code = child.proc.poll()
                if code is None or stopping:
                    continue
                backoff = min(2**child.restarts, 30) if time.monotonic() - child.started_at < 10 else 0
                out(f"chamber: {child.name} exited with code {code}; restarting in {backoff} s")
                time.sleep(backoff)
                child.proc = spawn(child.name, env, extra.get(child.name))
                child.started_at = time.monotonic()
                child.restarts += 1
    finally:
        for child in children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in children:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
