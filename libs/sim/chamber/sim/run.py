"""`chamber simulate`: load a scenario, run one or several policies, write the report, events and plots."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chamber.sim.engine import POLICIES, Simulation
from chamber.sim.report import plots, summarize, write
from chamber.sim.scenario import load, read_trace


def simulate(
    scenario_path: str, policies: list[str], out: Path, overrides: list[str] | None = None, progress: bool = True
) -> list[dict[str, Any]]:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown))}; use {', '.join(POLICIES)}")
    scenario, base = load(scenario_path, overrides)
    trace = read_trace(scenario, base)
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    sims = []
    horizon = max((j.submit_s for j in trace), default=0.0)
    for policy in policies:
        events_path = out / ("events.jsonl" if len(policies) == 1 else f"events-{policy}.jsonl")
        with events_path.open("wb") as events:
            bar = _bar(policy, horizon) if progress else None
            sim = Simulation(scenario, trace, policy, events, progress=_ticker(bar))
            wall = sim.run()
            if bar is not None:
                bar.close()
        reports.append(summarize(sim, wall))
        sims.append(sim)
    write(out, reports)
    plots(sims, out)
    return reports


def _bar(policy: str, horizon_s: float) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=round(horizon_s / 86400, 1),
        unit="day",
        desc=f"simulating {policy}",
        file=sys.stderr,
        bar_format="{desc}: {n:.1f}/{total} simulated days [{elapsed}]",
        disable=not sys.stderr.isatty(),
    )


def _ticker(bar: Any) -> Callable[[float], None] | None:
    if bar is None:
        return None

    def tick(dt: float) -> None:
        bar.update(dt / 86400)

    return tick
