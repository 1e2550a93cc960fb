"""`chamber up`: every service as its own process (as in a cluster), each restarted on its own when it dies.

- Every child runs through `chamber.cli.lifeline`, in its own process group: it dies with this process even
  when this process is SIGKILLed, and a Ctrl-C on the terminal reaches only the supervisor, which then stops
  the services first and the servers they use last.
- Each service has its own task: one service waiting out its restart back-off never delays another.
- A service that exits within `FAST_EXIT_S` of its start fails fast; the back-off doubles with each fast failure
  in a row (a kill by a signal included), and after `GIVE_UP_AFTER` fast failures in a row with an error status
  (not a kill: a bad file, a bad setting) the supervisor gives up, prints the service's last lines and stops.
- A service whose event loop stops turning is killed and so restarted: each touches a file of its own every few
  seconds (`CHAMBER_ALIVE_FILE`, `chamber.common.alive`, as the Helm chart's liveness probes read it), and one
  not touched for `STUCK_AFTER_S` is stuck (a process that never touched its file is not judged).
- Embedded nats-server and valkey-server that die are restarted on the same port with the same data.
- SIGINT and SIGTERM are handled at every moment (start-up, back-off, readiness wait): the first stops
  everything gracefully, a second one kills what is left at once.
"""

import asyncio
import collections
import contextlib
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chamber.cli.infra import EmbeddedServer, Infra, InfraError, make_tmpdir
from chamber.cli.lifeline import wrap
from chamber.common.alive import age_s

SERVICES = ("collector", "scheduler", "health", "quota", "gateway")
FAST_EXIT_S = 5.0
"""An exit this soon after the start is a fast failure."""
GIVE_UP_AFTER = 5
"""Fast failures in a row, the last with an error status, before the supervisor gives up on a service."""
FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 8.0
STOP_GRACE_S = 15.0
READY_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 20
STUCK_AFTER_S = 60.0
"""A service whose liveness file is older than this is killed (and restarted); the chart's probe allows ~60 s too."""
ALIVE_CHECK_S = 5.0

Out = Callable[[str], None]


@dataclass(frozen=True)
class Spec:
    """A process to keep running: its name, its command line and its environment."""

    name: str
    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class RestartPlan:
    delay_s: float
    give_up: bool = False


def plan_restart(fast_failures: int, exit_code: int) -> RestartPlan:
    """What to do after an exit, given the number of fast failures in a row (this one included).

    A kill by a signal (negative code: the OOM killer, an operator, the chaos test) is never a reason to give
    up; an error status repeated at every start is (a configuration problem a restart cannot fix).
    """
    if fast_failures == 0:
        return RestartPlan(0.0)
    if fast_failures >= GIVE_UP_AFTER and exit_code > 0:
        return RestartPlan(0.0, give_up=True)
    return RestartPlan(min(FIRST_BACKOFF_S * 2 ** (fast_failures - 1), MAX_BACKOFF_S))


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Child:
    """One supervised service and what the supervisor knows about it."""

    spec: Spec
    proc: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    starts: int = 0
    fast_failures: int = 0
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Supervisor:
    def __init__(
        self,
        specs: list[Spec],
        *,
        servers: list[EmbeddedServer] | None = None,
        ready_url: str | None = None,
        ready_service: str = "gateway",
        started: float | None = None,
        out: Out = print,
        log_sink: Callable[[bytes], None] | None = None,
        secrets: list[str] | None = None,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        self.children = [Child(spec) for spec in specs]
        self.servers = servers or []
        self.ready_url = ready_url
        self.ready_service = ready_service
        self.started = time.monotonic() if started is None else started
        self.out = out
        self.log_sink = log_sink or _write_stderr
        self.secrets = [secret for secret in secrets or [] if secret]
        """Passwords the services were given: replaced by *** in everything they print."""
        self.stuck_after_s = stuck_after_s
        self.stopping = asyncio.Event()
        self.failure: str | None = None
        self._signals = 0
        self._alive_dir: Path | None = None
        """Where each service's liveness file is (`make_tmpdir`: a killed supervisor's is swept by the next run)."""

    # ---- the whole -----------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until a signal (0) or until giving up on a process (1)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        self._alive_dir = Path(make_tmpdir())
        tasks = [asyncio.create_task(self._keep(child), name=child.spec.name) for child in self.children]
        tasks += [asyncio.create_task(self._keep_server(s), name=s.kind) for s in self.servers]
        if self.ready_url:
            tasks.append(asyncio.create_task(self._announce_ready(), name="ready"))
        try:
            await self.stopping.wait()
        finally:
            await self._stop_children()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for child in self.children:  # one that was being started as the stop began
                if child.alive and child.proc is not None:
                    child.proc.kill()
                    await child.proc.wait()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            shutil.rmtree(self._alive_dir, ignore_errors=True)
        if self.failure:
            self.out(self.failure)
            return 1
        return 0

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            self.out("chamber: stopping (Ctrl-C again to kill at once)")
            self.stopping.set()
        else:
            for child in self.children:
                if child.alive and child.proc is not None:
                    child.proc.kill()

    def give_up(self, message: str) -> None:
        if self.failure is None:
            self.failure = message
        self.stopping.set()

    async def _stop_children(self) -> None:
        live = [c.proc for c in self.children if c.alive and c.proc is not None]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        if not live:
            return
        _, pending = await asyncio.wait([asyncio.create_task(p.wait()) for p in live], timeout=STOP_GRACE_S)
        if pending:
            for proc in live:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            await asyncio.wait(pending, timeout=5)

    # ---- one service ---------------------------------------------------------------------------------------

    async def _keep(self, child: Child) -> None:
        """Start the service, and start it again whenever it exits, with its own back-off."""
        while not self.stopping.is_set():
            code = await self._run_once(child)
            if self.stopping.is_set():
                return
            ran = time.monotonic() - child.started_at
            child.fast_failures = child.fast_failures + 1 if ran < FAST_EXIT_S else 0
            plan = plan_restart(child.fast_failures, code)
            name = child.spec.name
            if plan.give_up:
                tail = "\n".join(f"  | {line}" for line in child.tail) or "  | (no output)"
                self.give_up(
                    f"chamber: giving up on {name}: it {describe_exit(code)} {child.fast_failures} times in a row "
                    f"within {FAST_EXIT_S:.0f} s of starting. Its last lines:\n{tail}"
                )
                return
            when = "now" if plan.delay_s == 0 else f"in {plan.delay_s:g} s"
            self.out(f"chamber: {name} {describe_exit(code)} after {ran:.1f} s; restarting {when}")
            if await _wait_or(self.stopping, plan.delay_s):
                return

    async def _run_once(self, child: Child) -> int:
        assert self._alive_dir is not None
        alive_file = self._alive_dir / f"{child.spec.name}.alive"
        alive_file.unlink(missing_ok=True)  # (the last run's: a new process is judged once it touched its own)
        proc = await asyncio.create_subprocess_exec(
            *wrap(child.spec.argv),
            env={**child.spec.env, "CHAMBER_ALIVE_FILE": str(alive_file)},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            process_group=0,
        )
        child.proc, child.started_at = proc, time.monotonic()
        child.starts += 1
        child.tail.clear()
        assert proc.stdout is not None
        pump = asyncio.create_task(self._pump(child, proc.stdout))
        watch = asyncio.create_task(self._watch(child, proc, alive_file))
        try:
            code = await proc.wait()
        finally:
            watch.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pump, timeout=2)  # the last lines, written just before exiting
        return code

    async def _watch(self, child: Child, proc: asyncio.subprocess.Process, alive_file: Path) -> None:
        """Kill the service once its event loop has not turned for `stuck_after_s` (`_keep` restarts it)."""
        while proc.returncode is None:
            await asyncio.sleep(min(ALIVE_CHECK_S, self.stuck_after_s / 4))
            age = age_s(alive_file)
            if age is not None and age > self.stuck_after_s and proc.returncode is None and not self.stopping.is_set():
                self.out(f"chamber: {child.spec.name} is stuck (its event loop has not turned for {age:.0f} s); "
                         "killing it")  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                return

    async def _pump(self, child: Child, stream: asyncio.StreamReader) -> None:
        """Pass the service's output through line by line, without secrets, keeping its last lines."""
        partial = b""
        while chunk := await stream.read(65536):
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            if len(partial) > 65536:  # a line without end: pass it on in pieces
                lines.append(partial)
                partial = b""
            if lines:
                self._emit(child, lines)
        if partial:
            self._emit(child, [partial])

    def _emit(self, child: Child, lines: list[bytes]) -> None:
        text = [self._redact(line.decode("utf-8", "replace")) for line in lines]
        child.tail.extend(line[:500] for line in text[-LOG_TAIL_LINES:])
        self.log_sink("".join(f"{line}\n" for line in text).encode())

    def _redact(self, line: str) -> str:
        for secret in self.secrets:
            line = line.replace(secret, "***")
        return line

    # ---- embedded servers ----------------------------------------------------------------------------------

    async def _keep_server(self, server: EmbeddedServer) -> None:
        """Restart an embedded server that died: same port, same data directory, with back-off if it keeps dying."""
        failures = 0
        while not self.stopping.is_set():
            if server.alive():
                failures = 0
                if await _wait_or(self.stopping, 0.2):
                    return
                continue
            code = server.proc.returncode if server.proc is not None else None
            failures += 1
            if failures > GIVE_UP_AFTER:
                self.give_up(f"chamber: giving up on the {server.what}: it does not stay up on port {server.port}")
                return
            delay = 0.0 if failures == 1 else min(FIRST_BACKOFF_S * 2 ** (failures - 2), MAX_BACKOFF_S)
            self.out(
                f"chamber: the {server.what} exited with code {code}; restarting it on port {server.port} "
                f"with its data" + (f" in {delay:g} s" if delay else "")
            )
            if await _wait_or(self.stopping, delay):
                return
            server.spawn()  # here, in the loop's thread: the lifeline ties it to this thread
            try:
                await asyncio.to_thread(server.wait_answering)
            except InfraError as exc:
                self.out(f"chamber: {exc}")

    # ---- readiness -----------------------------------------------------------------------------------------

    async def _announce_ready(self) -> None:
        """Say "ready" once our own gateway answers /healthz (never an old one: the port was checked free)."""
        gateway = next((c for c in self.children if c.spec.name == self.ready_service), None)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            ours = gateway is None or gateway.alive
            if ours and await asyncio.to_thread(_healthy, f"{self.ready_url}/healthz"):
                took = time.monotonic() - self.started
                self.out(f"chamber: ready in {took:.1f} s: API at {self.ready_url}; Ctrl-C stops everything")
                return
            await asyncio.sleep(0.1)
        self.out(f"chamber: the API did not become ready within {READY_TIMEOUT_S:.0f} s; see the service logs above")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


async def _wait_or(event: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if `event` is set; True when it was set."""
    if event.is_set():
        return True
    if seconds <= 0:
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout=seconds)
    return event.is_set()


def _write_stderr(chunk: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.flush()


def service_specs(infra: Infra, env_overrides: dict[str, str] | None = None) -> list[Spec]:
    env = {
        **os.environ,
        **(env_overrides or {}),
        "CHAMBER_NATS_URL": infra.nats_url,
        "CHAMBER_REDIS_URL": infra.redis_url,
        "PYTHONUNBUFFERED": "1",
    }
    return [Spec(name, [sys.executable, "-m", "chamber.cli.main", "service", name], env) for name in SERVICES]


def supervise(
    infra: Infra,
    api_url: str,
    started: float,
    *,
    out: Out = print,
    env_overrides: dict[str, str] | None = None,
    extra: dict[str, list[str]] | None = None,
) -> int:
    """Run the five services (and watch the embedded servers) until Ctrl-C; the exit status. `extra`: more
    children (name -> `chamber` arguments) started before the services, e.g. the emulated Kubernetes API of
    `chamber up --kube-emulator`."""
    specs = service_specs(infra, env_overrides)
    env = specs[0].env
    before = [
        Spec(name, [sys.executable, "-m", "chamber.cli.main", *argv], env) for name, argv in (extra or {}).items()
    ]
    supervisor = Supervisor(
        before + specs, servers=list(infra.embedded), ready_url=api_url, started=started, out=out,
        secrets=infra.secrets(),
    )  # fmt: skip
    return asyncio.run(supervisor.run())
