"""The supervisor of `chamber up`, on tiny stand-in processes: restart policy, independence, signals, giving up,
embedded server restarts and redaction."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import nats
import pytest

from chamber.cli import supervisor as sup
from chamber.cli.infra import Infra, embedded_nats
from chamber.cli.supervisor import RestartPlan, Spec, Supervisor, plan_restart
from chamber.common.urls import redact
from tests.support.services import eventually

pytestmark = pytest.mark.timeout(60)

STEADY = "import time; time.sleep(3600)"
KILLS_ITSELF = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


def spec(name: str, code: str) -> Spec:
    return Spec(name, [sys.executable, "-c", code], dict(os.environ))


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)

    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.mark.parametrize(
    ("fast_failures", "exit_code", "expected"),
    [
        pytest.param(0, 1, RestartPlan(0.0), id="after a long run: at once"),
        pytest.param(1, -9, RestartPlan(0.25), id="first fast failure: a short pause"),
        pytest.param(3, 1, RestartPlan(1.0), id="doubling"),
        pytest.param(20, -9, RestartPlan(8.0), id="capped, and a kill is never a reason to give up"),
        pytest.param(5, 2, RestartPlan(0.0, give_up=True), id="five fast error exits in a row: give up"),
        pytest.param(4, 2, RestartPlan(2.0), id="four are not enough"),
    ],
)
def test_restart_plan(fast_failures: int, exit_code: int, expected: RestartPlan) -> None:
    assert plan_restart(fast_failures, exit_code) == expected


async def test_one_service_in_back_off_does_not_delay_restarting_another() -> None:
    out = Lines()
    supervisor = Supervisor([spec("crasher", KILLS_ITSELF), spec("steady", STEADY)], out=out, log_sink=lambda b: None)
    run = asyncio.create_task(supervisor.run())
    crasher, steady = supervisor.children
    await eventually(lambda: crasher.fast_failures >= 4, within=20, what="the crasher in a 2 s back-off")
    assert steady.proc is not None
    first_pid = steady.proc.pid
    killed_at = time.monotonic()
    steady.proc.kill()
    await eventually(lambda: steady.proc is not None and steady.proc.pid != first_pid, within=5, what="restart")
    took = time.monotonic() - killed_at
    starts = crasher.starts
    supervisor.stopping.set()
    assert await run == 0
    assert took < 1.0, f"steady restarted {took:.2f} s after it died, behind the crasher's back-off"
    assert starts == crasher.starts, "the crasher was still waiting out its back-off"


GETS_STUCK = """
import asyncio, os, time
from pathlib import Path
from chamber.common.alive import beat

async def main():
    asyncio.create_task(beat(Path(os.environ["CHAMBER_ALIVE_FILE"]), 0.05))
    await asyncio.sleep(0.3)
    time.sleep(3600)  # the event loop stuck in a call, as in a hung NVML call

asyncio.run(main())
"""


async def test_a_service_whose_event_loop_is_stuck_is_killed_and_restarted_and_one_never_watched_is_left() -> None:
    out = Lines()
    supervisor = Supervisor(
        [spec("stuck", GETS_STUCK), spec("steady", STEADY)], out=out, log_sink=lambda b: None, stuck_after_s=1.0
    )
    run = asyncio.create_task(supervisor.run())
    stuck, steady = supervisor.children
    await eventually(lambda: stuck.starts >= 2, within=15, what="the stuck service killed and started again")
    assert steady.starts == 1, "a process that never touched its liveness file is not judged"
    supervisor.stopping.set()
    assert await run == 0
    assert "chamber: stuck is stuck (its event loop has not turned for" in out.text()
    assert "chamber: stuck was killed by SIGKILL" in out.text()


async def test_a_signal_during_a_back_off_stops_everything_at_once() -> None:
    out = Lines()
    supervisor = Supervisor([spec("crasher", KILLS_ITSELF), spec("steady", STEADY)], out=out, log_sink=lambda b: None)
    run = asyncio.create_task(supervisor.run())
    await eventually(lambda: supervisor.children[0].fast_failures >= 5, within=20, what="a 4 s back-off")
    signalled = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)
    assert await asyncio.wait_for(run, timeout=5) == 0
    assert time.monotonic() - signalled < 2.0
    assert not supervisor.children[1].alive
    assert "chamber: stopping" in out.text()


async def test_gives_up_on_a_service_that_fails_fast_and_shows_its_last_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sup, "FIRST_BACKOFF_S", 0.01)
    out = Lines()
    code = "import sys; print('reading quota.yml'); sys.exit('cannot read quota file quota.yml: no such file')"
    supervisor = Supervisor([spec("quota", code), spec("steady", STEADY)], out=out, log_sink=lambda b: None)
    assert await asyncio.wait_for(supervisor.run(), timeout=30) == 1
    assert supervisor.children[0].starts == sup.GIVE_UP_AFTER
    message = out.lines[-1]
    assert message.startswith("chamber: giving up on quota: it exited with code 1 5 times in a row")
    assert "| cannot read quota file quota.yml: no such file" in message
    assert "| reading quota.yml" in message
    assert not supervisor.children[1].alive, "the others are stopped too"


async def test_a_dead_embedded_nats_is_restarted_on_its_port_with_its_streams(tmp_path: Path) -> None:
    server = embedded_nats(tmp_path)
    server.start()
    infra = Infra(nats_url=server.url, redis_url="", embedded=[server])
    out = Lines()
    supervisor = Supervisor([], servers=infra.embedded, out=out)
    run = asyncio.create_task(supervisor.run())
    try:
        nc = await nats.connect(server.url)
        await nc.jetstream().add_stream(name="KEEP", subjects=["keep.>"])
        await nc.jetstream().publish("keep.one", b"1")
        await nc.close()
        assert server.proc is not None
        first = server.proc.pid
        server.proc.kill()
        await eventually(
            lambda: server.proc is not None and server.proc.pid != first and server.answers(), within=10,
            what="the embedded nats-server back",
        )  # fmt: skip
        nc = await nats.connect(server.url)
        info = await nc.jetstream().stream_info("KEEP")
        await nc.close()
        assert info.state.messages == 1, "same data directory"
        assert f"restarting it on port {server.port}" in out.text()
    finally:
        supervisor.stopping.set()
        await run
        infra.stop()


def test_passwords_are_redacted_from_urls_and_output() -> None:
    assert redact("nats://chamber:s3cr%40t@nats.internal:4222") == "nats://chamber:***@nats.internal:4222"
    assert redact("redis://:hunter2@10.0.0.5:6379/0") == "redis://:***@10.0.0.5:6379/0"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    infra = Infra(nats_url="nats://u:s3cr%40t@h:4222", redis_url="redis://:hunter2@h:6379/0", origin={})
    assert "s3cr" not in infra.describe()
    assert "hunter2" not in infra.describe()
    seen: list[bytes] = []
    supervisor = Supervisor([], secrets=infra.secrets(), log_sink=seen.append)
    child = sup.Child(spec("svc", STEADY))
    supervisor._emit(child, [b"nats.connect_retry url=nats://u:s3cr@t@h:4222", b"auth hunter2 refused"])
    assert b"s3cr" not in b"".join(seen)
    assert b"hunter2" not in b"".join(seen)
    assert "hunter2" not in "".join(child.tail)
