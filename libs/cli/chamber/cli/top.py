"""`chamber top`: the fleet in the terminal, redrawn every few seconds (rich). Tiles with the fleet's numbers, a
bar per node (allocated and out-of-service GPUs), the biggest running jobs and the head of the queue with why
each one waits."""

import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from chamber.cli.client import Api
from chamber.cli.output import age, console, pct

BAR = 16


def _tiles(fleet: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 3))
    cells = [
        ("GPUs", str(fleet["gpus_total"])),
        ("healthy", str(fleet.get("gpus_healthy") if fleet.get("gpus_healthy") is not None else "-")),
        ("allocated", str(fleet["gpus_allocated"])),
        ("free", str(fleet["gpus_free"])),
        ("out", str(fleet["gpus_unschedulable"])),
        ("utilization", pct(fleet.get("utilization"))),
        ("idle", pct(fleet.get("idle_ratio"))),
        ("efficiency", pct(fleet.get("efficiency_score"))),
        ("queue", str(fleet["queue_depth"])),
        ("idle $/h", f"{fleet['idle_cost_per_hour']:.0f}" if fleet.get("idle_cost_per_hour") is not None else "-"),
    ]
    for _ in cells:
        grid.add_column(justify="center")
    grid.add_row(*(Text(v, style="bold") for _, v in cells))
    grid.add_row(*(Text(k, style="dim") for k, _ in cells))
    return grid


def _bar(node: dict[str, Any]) -> Text:
    total = max(1, node["gpus_total"])
    used = round(BAR * node["gpus_allocated"] / total)
    out = round(BAR * node["gpus_unschedulable"] / total)
    text = Text()
    text.append("█" * used, style="green")
    text.append("█" * out, style="red")
    text.append("·" * max(0, BAR - used - out), style="dim")
    return text


def _nodes(nodes: list[dict[str, Any]]) -> Table:
    grid = Table(box=None, show_header=False, pad_edge=False)
    per_row = 3
    for _ in range(per_row):
        grid.add_column()
        grid.add_column()
    cells: list[Any] = []
    for n in nodes:
        label = f"{n['name']} {n['gpus_allocated']}/{n['gpus_total']}" + (
            f" ({n['gpus_unschedulable']} out)" if n["gpus_unschedulable"] else ""
        )
        cells += [Text(label), _bar(n)]
    while cells:
        row, cells = cells[: per_row * 2], cells[per_row * 2 :]
        grid.add_row(*row, *([""] * (per_row * 2 - len(row))))
    return grid


def _jobs(jobs: list[dict[str, Any]], title: str, reason: bool) -> Table:
    out = Table(title=title, box=None, header_style="bold", title_justify="left", pad_edge=False)
    for header in ("JOB", "TEAM", "GPUS", "PRIORITY", "AGE", *(["WHY IT WAITS"] if reason else [])):
        out.add_column(header, overflow="ellipsis", no_wrap=True, max_width=70 if header == "WHY IT WAITS" else None)
    for j in jobs:
        out.add_row(j["name"], j["team"], str(j["gpus"]), j["priority"], age(j["submitted_at"]),
                    *([j["reason"]] if reason else []))  # fmt: skip
    return out


def frame(api: Api) -> Group:
    fleet = api.get("/v1/fleet")
    nodes = api.get("/v1/nodes")
    running = sorted(api.get("/v1/jobs", state="running", limit=500), key=lambda j: -j["gpus"])[:8]
    pending = api.get("/v1/jobs", state="pending", limit=500)
    pending = sorted(pending, key=lambda j: j["submitted_at"])[:8]
    return Group(
        Panel(_tiles(fleet), title=f"chamber top · {api.target.url} · {time.strftime('%H:%M:%S')}"),
        _nodes(nodes),
        Text(""),
        _jobs(running, f"running ({fleet['jobs_running']})", reason=False),
        Text(""),
        _jobs(pending, f"waiting ({fleet['queue_depth']})", reason=True),
    )


def run_top(api: Api, *, interval_s: float, once: bool) -> int:
    if once:
        console().print(frame(api))
        return 0
    with Live(frame(api), console=console(), auto_refresh=False, screen=False) as live:
        while True:
            time.sleep(interval_s)
            live.update(frame(api), refresh=True)
