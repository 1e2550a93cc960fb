"""The liveness file (`chamber.common.alive`): touched while a service's event loop turns, judged by the probe the
Helm chart runs in every Chamber container."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chamber.common.alive import beat, check, main
from chamber.common.runtime import serve
from chamber.common.settings import Settings


def test_a_file_touched_within_the_age_is_alive_and_an_older_or_missing_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    assert "does not exist" in (check(path, 30) or "")
    path.touch()
    now = path.stat().st_mtime
    assert check(path, 30, now=now + 29) is None
    assert "stuck" in (check(path, 30, now=now + 31) or "")


def test_the_probe_command_exits_0_alive_1_stuck_or_missing_2_misused(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    assert main([str(path), "30"]) == 1
    path.touch()
    assert main([str(path), "30"]) == 0
    old = time.time() - 60
    os.utime(path, (old, old))
    assert main([str(path), "30"]) == 1
    assert main([str(path)]) == 2
    assert main([str(path), "soon"]) == 2


def test_the_probe_runs_as_the_chart_runs_it_and_imports_nothing_of_chamber_but_itself(tmp_path: Path) -> None:
    """The kubelet execs it every period in every Chamber container: it must not import the services."""
    path = tmp_path / "alive"
    path.touch()
    probe = [sys.executable, "-m", "chamber.common.alive", str(path), "30"]
    assert subprocess.run(probe, capture_output=True, check=False).returncode == 0
    old = time.time() - 60
    os.utime(path, (old, old))
    stuck = subprocess.run(probe, capture_output=True, text=True, check=False)
    assert stuck.returncode == 1
    assert "stuck" in stuck.stderr
    code = "import sys, chamber.common.alive; print(sorted(m for m in sys.modules if m.startswith('chamber')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['chamber', 'chamber.common', 'chamber.common.alive']"


async def test_the_file_is_touched_while_the_loop_turns_and_not_while_it_is_blocked(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    task = asyncio.create_task(beat(path, interval_s=0.05))
    try:
        await asyncio.sleep(0.01)
        first = path.stat().st_mtime_ns
        await asyncio.sleep(0.2)
        assert path.stat().st_mtime_ns > first, "touched again while the loop turns"
        before = path.stat().st_mtime_ns
        time.sleep(0.3)  # noqa: ASYNC251 (the point: the loop blocked, as by a hung call)
        assert path.stat().st_mtime_ns == before
        assert check(path, 0.2) is not None
    finally:
        task.cancel()


def test_a_service_served_with_an_alive_file_touches_it_while_it_runs_and_stops_with_it(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    seen: list[str | None] = []

    async def service(ctx: object, stop: asyncio.Event) -> None:
        await asyncio.sleep(0.05)
        seen.append(check(path, 5))

    asyncio.run(serve("test", service, Settings(alive_file=str(path))))
    assert seen == [None], "alive while the service ran"
    touched = path.stat().st_mtime_ns
    time.sleep(0.05)
    assert path.stat().st_mtime_ns == touched, "no longer touched once the service returned"


@pytest.mark.parametrize("value", ["", None])
def test_without_an_alive_file_none_is_written(
    tmp_path: Path, value: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    async def service(ctx: object, stop: asyncio.Event) -> None:
        await asyncio.sleep(0.01)

    asyncio.run(serve("test", service, Settings() if value is None else Settings(alive_file=value)))
    assert list(tmp_path.iterdir()) == []
