"""The `chamber` client commands against a real gateway (and a simulated fleet and scheduler): what a user types
and reads. The commands run in a worker thread, as they block; the services run in the test's loop."""

import asyncio
import json
import os
import re
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import yaml

from chamber.cli.infra import free_port
from chamber.cli.main import main
from chamber.collector import service as collector
from chamber.common.settings import Settings
from chamber.gateway import service as gateway
from chamber.scheduler import service as scheduler
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")


class Cli:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    async def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = await asyncio.to_thread(main, list(argv))
        out, err = self.capsys.readouterr()
        return code, _without_service_logs(out), err


def _without_service_logs(text: str) -> str:
    """The services share the test's stdout; their structlog lines are not the command's output."""
    return "".join(line for line in text.splitlines(keepends=True) if not LOG_LINE.match(line))


@pytest.fixture
async def cli(
    settings: Settings, cleanup: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> AsyncIterator[Cli]:  # fmt: skip
    port = free_port()
    live = msgspec.structs.replace(settings, http_port=port)
    monkeypatch.setenv("CHAMBER_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("CHAMBER_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("CHAMBER_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    run = Cli(capsys)
    async with running(live, ("collector", collector.main), ("scheduler", scheduler.main), ("gateway", gateway.main)):

        async def ready() -> bool:
            code, out, _ = await run("nodes", "-o", "json", "--token", settings.admin_token)
            return code == 0 and len(json.loads(out)) == 4

        await eventually(ready, what="the gateway serves the inventory")
        yield run


async def test_login_submit_list_describe_cancel(cli: Cli, settings: Settings, tmp_path: Path) -> None:
    code, _, err = await cli("jobs")
    assert code == 1
    assert "chamber login" in err, "without a token the user is told how to get in"
    code, out, _ = await cli("login", "--token", settings.admin_token)
    assert code == 0
    assert "as bootstrap admin (admin)" in out
    assert stat.S_IMODE(os.stat(tmp_path / "config.json").st_mode) == 0o600

    code, out, _ = await cli("submit", "--name", "train-llm", "--team", "ml", "--gpus", "8", "--replicas", "2",
                             "--duration", "60")  # fmt: skip
    assert code == 0, out
    job_id = out.split()[1]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "eval", "team": "ml", "gpus_per_replica": 4,
                                                       "priority": "research", "duration_s": 60}))  # fmt: skip
    code, out, _ = await cli("submit", "-f", "job.yaml", "-o", "json")
    assert code == 0
    assert json.loads(out)["priority"] == "research"

    async def both_running() -> bool:
        _, out, _ = await cli("jobs", "--state", "running", "-o", "json")
        return len(json.loads(out)) == 2

    await eventually(both_running, what="both jobs run")
    code, out, _ = await cli("jobs")
    assert "train-llm" in out
    assert "2x8" in out
    assert "ID" in out.splitlines()[0]
    code, out, _ = await cli("jobs", "-o", "wide")
    assert "NODES" in out
    assert "node-000" in out
    code, out, _ = await cli("jobs", "-o", "yaml", "--team", "ml")
    assert {j["name"] for j in yaml.safe_load(out)} == {"train-llm", "eval"}

    code, out, _ = await cli("describe", "job", job_id)
    assert code == 0
    assert "Timeline" in out
    assert "submitted" in out
    assert "placed" in out
    assert "started" in out
    code, out, _ = await cli("cancel", job_id)
    assert code == 0
    assert "cancel requested" in out

    code, _, err = await cli("submit", "--name", "huge", "--team", "ml", "--gpus", "8", "--replicas", "1024")
    assert code == 1
    assert "(422)" in err
    assert "never fit" in err


async def test_teams_nodes_top_and_tokens(cli: Cli, settings: Settings) -> None:
    token = ("--token", settings.admin_token)
    code, out, _ = await cli("nodes", *token)
    assert code == 0
    assert "node-0003" in out
    code, out, _ = await cli("teams", *token)
    assert code == 0
    code, out, _ = await cli("top", "--once", *token)
    assert code == 0
    assert "GPUs" in out
    assert "allocated" in out
    assert "waiting" in out
    code, out, _ = await cli("tokens", "create", "ci-bot", "--role", "member", "--team", "ml", *token)
    assert code == 0
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("chm_")
    code, out, _ = await cli("tokens", "-o", "json", *token)
    made = next(t for t in json.loads(out) if t["name"] == "ci-bot")
    assert made["teams"] == ["ml"]
    code, _, err = await cli("submit", "--name", "x", "--team", "vision", "--gpus", "1", "--token", secret)
    assert code == 1
    assert "(403)" in err
    code, out, _ = await cli("tokens", "revoke", made["id"], *token)
    assert code == 0
    code, _, err = await cli("jobs", "--token", secret)
    assert code == 1
    assert "revoked" in err
    code, out, _ = await cli("tokens", "create", "nightly", "--role", "viewer", "--expires-in", "12h", *token)
    assert code == 0
    code, out, _ = await cli("tokens", *token)
    assert any("nightly" in line and "in 12h" in line for line in out.splitlines()), out
    code, _, err = await cli("tokens", "create", "x", "--role", "viewer", "--expires-in", "soon", *token)
    assert code != 0
    assert "--expires-in: not a duration: 'soon'" in err


async def test_jobs_watch_redraws_on_changes(cli: Cli, settings: Settings) -> None:
    token = ("--token", settings.admin_token)
    watcher = asyncio.create_task(cli("jobs", "--watch", "--watch-for", "2", *token))
    await asyncio.sleep(0.5)
    await cli("submit", "--name", "watched", "--team", "ml", "--gpus", "1", "--duration", "0.2", *token)
    code, out, _ = await watcher
    assert code == 0
    assert "watched" in out
