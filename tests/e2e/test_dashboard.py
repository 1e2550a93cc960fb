"""The dashboard in a real browser (Chromium through Playwright) against the real services as processes, on the
simulated fleet of `make up` (16 nodes x 8 H100) with the example quotas: sign in, every view, what each shows,
a live update without reloading. Screenshots go to test-artifacts/dashboard/ (CHAMBER_UPDATE_SCREENSHOT=1 also
refreshes docs/img/dashboard.png for the README)."""

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from chamber.cli.infra import free_port
from chamber.common.settings import Settings
from tests.support.browser import FLAGS, chromium
from tests.support.processes import ServiceProcesses

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

ROOT = Path(__file__).parents[2]
SHOTS = ROOT / "test-artifacts" / "dashboard"
SCREENS = ["01-login", "02-overview", "03-teams", "04-queue", "05-jobs", "06-job", "07-nodes", "08-node", "09-live"]


def _job(
    name: str, team: str, gpus: int, replicas: int = 1, *, priority: str = "train", duration: float = 600
) -> dict[str, Any]:
    return {"name": name, "team": team, "gpus_per_replica": gpus, "replicas": replicas, "priority": priority,
            "duration_s": duration}  # fmt: skip


@pytest.fixture
def fleet(settings: Settings, cleanup: None, tmp_path: Path) -> Iterator[tuple[str, httpx.Client]]:
    port = free_port()
    live = msgspec.structs.replace(settings, http_port=port, fleet_nodes=16, gpus_per_node=8, telemetry_interval_s=1.0,
                                   quota_file=str(ROOT / "deploy" / "examples" / "quota.yaml"))  # fmt: skip
    procs = ServiceProcesses(live, tmp_path)
    for name in ("collector", "scheduler", "quota", "health", "gateway"):
        procs.start(name)
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, headers={"authorization": f"Bearer {settings.admin_token}"}, timeout=10)
    try:
        _until(lambda: http.get("/v1/fleet").json().get("gpus_total") == 128, "the fleet's inventory", procs)
        _until(lambda: len(http.get("/v1/teams").json()) == 3, "the example quotas", procs)
        jobs = [_job(f"llama-ft-{i}", "nlp", 8) for i in range(6)] + [_job(f"vit-{i}", "vision", 8, priority="research")
                for i in range(3)] + [_job("chat-serving", "serving", 8, 2, priority="inference")]  # fmt: skip
        jobs += [_job(f"sweep-{i}", "nlp", 8, 2, priority="research") for i in range(4)]
        jobs += [_job("big-pretrain", "vision", 8, 8, priority="train")]
        for body in jobs:
            assert http.post("/v1/jobs", json=body).status_code == 201
        _until(lambda: http.get("/v1/fleet").json()["jobs_running"] >= 10, "jobs running", procs)
        fault = {"node": "node-0003", "gpu": 2, "fault": "dbe"}
        assert http.post("/v1/sim/faults", json=fault).status_code == 202
        _until(lambda: http.get("/v1/nodes/node-0003").json()["gpus"][2]["state"] == "quarantined", "quarantine", procs)
        yield url, http
    finally:
        http.close()
        procs.stop_all()


def _until(check: Any, what: str, procs: ServiceProcesses, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if check():
                return
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            pass
        assert time.monotonic() < deadline, f"{what} not within {within} s\n{procs.logs()}"
        time.sleep(0.2)


def test_the_dashboard_shows_every_view_and_updates_live(
    fleet: tuple[str, httpx.Client], settings: Settings, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, http = fleet
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium(), args=FLAGS, headless=True,
            viewport={"width": 1440, "height": 900},
        )  # fmt: skip
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        def shot(name: str) -> None:
            page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

        def view(name: str) -> None:
            page.click(f"#nav a[data-view={name}]")
            page.wait_for_function(f"document.body.dataset.rendered === '{name}'")

        page.goto(url + "/")
        expect(page.locator("#login")).to_be_visible()
        page.fill("#token", "not-a-token")
        page.click("#login-form button")
        expect(page.locator("#login-error")).to_contain_text("refused")
        shot("01-login")
        page.fill("#token", settings.admin_token)
        page.click("#login-form button")
        expect(page.locator("#whoami")).to_contain_text("admin")

        page.wait_for_function("document.body.dataset.rendered === 'overview'")
        expect(page.locator("[data-tile=gpus-total] .value")).to_have_text("128")
        expect(page.locator("[data-tile=gpus-healthy] .value")).not_to_have_text(
            "\u2013"
        )  # the dash shown while unknown
        allocated = int(page.inner_text("[data-tile=gpus-allocated] .value"))
        assert allocated >= 80, "most of the fleet is allocated"
        expect(page.locator("#heatmap .cell")).to_have_count(128)
        expect(page.locator("#heatmap .cell.out")).to_have_count(1)
        expect(page.locator("#chart svg polyline.alloc")).to_have_count(1)
        expect(page.locator("#live")).to_have_class("live on")
        shot("02-overview")

        view("teams")
        rows = page.locator("#teams-table tbody tr")
        expect(rows).to_have_count(3)
        expect(page.locator("#teams-table")).to_contain_text("nlp")
        expect(page.locator("#teams-table")).to_contain_text("serving")
        expect(page.locator("#teams-table .bar")).to_have_count(3)
        shot("03-teams")

        view("queue")
        expect(page.locator("#queue-table")).to_contain_text("big-pretrain")
        reasons = page.locator("#queue-table tbody tr td:last-child")
        assert all(text.strip() for text in reasons.all_inner_texts()), "every waiting job says why"
        shot("04-queue")

        view("jobs")
        expect(page.locator("#jobs-table")).to_contain_text("llama-ft-0")
        shot("05-jobs")
        page.click("#jobs-table a:text-is('llama-ft-0')")
        page.wait_for_function("document.body.dataset.rendered === 'job'")
        expect(page.locator("#timeline")).to_contain_text("submitted")
        expect(page.locator("#timeline")).to_contain_text("placed")
        expect(page.locator("#timeline")).to_contain_text("started")
        expect(page.locator("#job-title")).to_contain_text("running")
        shot("06-job")

        view("nodes")
        expect(page.locator("#nodes-table tbody tr")).to_have_count(16)
        node_row = page.locator("#nodes-table tbody tr", has_text="node-0003")
        expect(node_row).to_contain_text("ecc-dbe")
        shot("07-nodes")
        node_row.locator("a").click()
        page.wait_for_function("document.body.dataset.rendered === 'node'")
        expect(page.locator("#node-gpus tbody tr").nth(2)).to_contain_text("quarantined")
        expect(page.locator("#node-history")).to_contain_text("quarantined")
        expect(page.locator("#node-gpus .action")).not_to_have_count(0)
        shot("08-node")

        view("jobs")
        assert http.post("/v1/jobs", json=_job("live-check", "serving", 1)).status_code == 201
        expect(page.locator("#jobs-table")).to_contain_text("live-check", timeout=10_000)
        shot("09-live")
        browser.close()
    assert not errors, errors
    assert sorted(p.stem for p in SHOTS.glob("*.png")) >= SCREENS
    if os.environ.get("CHAMBER_UPDATE_SCREENSHOT"):
        shutil.copy(SHOTS / "02-overview.png", ROOT / "docs" / "img" / "dashboard.png")
