"""What a simulation reports: report.json, a readable report.md, and PNG plots.

Besides throughput and JCT: finished against submitted, queueing by size class, guarantee shortfall, fairness
and waits within the guarantee (defined in `chamber.sim.quality`), preemptions and GPU-hours lost, and the GPU-hours
that synthetic notebook sessions held. `--compare` adds each metric's ratio against the first policy.
"""

import statistics
from pathlib import Path
from typing import Any

import msgspec

from chamber.common.contracts import TERMINAL_STATES
from chamber.sim.engine import Simulation
from chamber.sim.quality import SIZE_CLASSES, Timeline, guarantees, queueing_by_size


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(sim: Simulation, wall_s: float) -> dict[str, Any]:
    jobs = list(sim.jobs.values())
    finished = [j for j in jobs if j.finished_at is not None]
    jct = [j.finished_at - j.trace.submit_s for j in finished if j.finished_at is not None]
    queue = [j.first_start - j.trace.submit_s for j in jobs if j.first_start is not None]
    first = min((j.trace.submit_s for j in jobs), default=0.0)
    makespan = max((j.finished_at for j in finished if j.finished_at is not None), default=first) - first
    end = first + makespan
    total_gpu_s = len(sim.slots) * makespan
    intervals = [*sim.stats.down_intervals, *((t, sim.now) for t in sim.down.values())]
    down_gpu_s = sum(max(0.0, min(b, end) - max(a, first)) for a, b in intervals)
    healthy_gpu_s = max(0.0, total_gpu_s - down_gpu_s)
    busy = sim.stats.busy_gpu_s
    teams: dict[str, dict[str, Any]] = {}
    for team in sorted({j.trace.team for j in jobs}):
        mine = [j for j in jobs if j.trace.team == team]
        done = [j for j in mine if j.finished_at is not None]
        t_jct = [j.finished_at - j.trace.submit_s for j in done if j.finished_at is not None]
        t_queue = [j.first_start - j.trace.submit_s for j in mine if j.first_start is not None]
        teams[team] = {
            "jobs": len(mine),
            "finished": len(done),
            "avg_jct_s": round(statistics.fmean(t_jct), 1) if t_jct else 0.0,
            "avg_queue_s": round(statistics.fmean(t_queue), 1) if t_queue else 0.0,
            "gpu_hours": round(sum(j.trace.gpus * j.trace.duration_s for j in done) / 3600, 1),
            "quota": sum(q.nominal for (t, _), q in sim.book.quotas.items() if t == team),
            "preemptions": sum(j.preemptions for j in mine),
        }
    timelines = timelines_of(sim)
    quota = {team: sum(q.nominal for (t, _), q in sim.book.quotas.items() if t == team) for team in sim.book.teams}
    quality = guarantees(timelines, quota, first, max(sim.now, first))
    notebook_gpu_s = sum(sum(b - a for a, b in t.runs) * t.gpus for t, j in zip(timelines, jobs, strict=True)
                         if j.trace.kind == "notebook")  # fmt: skip
    return {
        "scenario": sim.scenario.name,
        "policy": sim.policy,
        "jobs": len(jobs),
        "finished": len(finished),
        "unfinished": len(jobs) - len(finished),
        "gpus": len(sim.slots),
        "makespan_s": round(makespan, 1),
        "utilization": round(busy / healthy_gpu_s, 4) if healthy_gpu_s else 0.0,
        "avg_jct_s": round(statistics.fmean(jct), 1) if jct else 0.0,
        "p50_jct_s": round(_pct(jct, 0.5), 1),
        "p99_jct_s": round(_pct(jct, 0.99), 1),
        "avg_queue_s": round(statistics.fmean(queue), 1) if queue else 0.0,
        "p99_queue_s": round(_pct(queue, 0.99), 1),
        "idle_gpu_hours": round(max(0.0, healthy_gpu_s - busy) / 3600, 1),
        "preemptions": sim.stats.preemptions,
        "moves": sim.stats.moves,
        "interruptions": sim.stats.interruptions,
        "faults": sim.stats.faults,
        "gpu_hours_lost": round(sim.stats.lost_gpu_s / 3600, 1),
        "gpu_hours_lost_to_faults": round(sim.stats.lost_fault_gpu_s / 3600, 1),
        "gpu_hours_down": round(down_gpu_s / 3600, 3),
        "queue_by_size": queueing_by_size(timelines, max(sim.now, first)),
        "guarantee_shortfall": quality["guarantee_shortfall"],
        "guarantee_shortfall_entitled": quality["guarantee_shortfall_entitled"],
        "jain_fairness": quality["jain_fairness"],
        "contended_hours": quality["contended_hours"],
        "max_wait_within_guarantee_s": quality["max_wait_within_guarantee_s"],
        "max_wait_within_guarantee_job": quality["max_wait_within_guarantee_job"],
        "team_shortfall": quality["team_shortfall"],
        "notebooks": sum(1 for j in jobs if j.trace.kind == "notebook"),
        "notebook_gpu_hours": round(notebook_gpu_s / 3600, 1),
        "teams": teams,
        "sim_wall_s": round(wall_s, 2),
    }


def timelines_of(sim: Simulation) -> list[Timeline]:
    """Each job's timeline, in `sim.jobs` order: an attempt still holding GPUs at the end runs until then."""
    out = []
    for job in sim.jobs.values():
        runs = list(job.runs)
        record = sim.control.records.get(job.trace.id)
        held = record is not None and record.placement is not None and record.state not in TERMINAL_STATES
        if held and record is not None and record.started_at is not None and (not runs or runs[-1][1] < sim.now):
            runs.append((record.started_at, sim.now))
        gpus = job.spec.gpus_per_replica * job.spec.replicas
        out.append(Timeline(job.trace.id, job.trace.team, gpus, job.trace.submit_s, tuple(runs), job.finished_at))
    return out


HEADLINE = ["jobs", "finished", "makespan_s", "utilization", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s",
            "p99_queue_s", "idle_gpu_hours", "preemptions", "gpu_hours_lost", "guarantee_shortfall",
            "guarantee_shortfall_entitled", "jain_fairness", "max_wait_within_guarantee_s", "notebook_gpu_hours",
            "sim_wall_s"]  # fmt: skip
SIZE_METRICS = ["jobs", "avg_s", "p99_s", "max_s", "never_started"]


def rows(report: dict[str, Any]) -> dict[str, Any]:
    """The report's metrics as one flat table (what `--compare` sets side by side)."""
    flat = {key: report[key] for key in HEADLINE}
    for name, _, _ in SIZE_CLASSES:
        for metric in SIZE_METRICS:
            flat[f"queue_{name}_{metric}"] = report["queue_by_size"][name][metric]
    return flat


def ratios(reports: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """policy -> metric -> its value over the first policy's (None where the first is 0)."""
    base = rows(reports[0])
    out: dict[str, dict[str, float | None]] = {}
    for r in reports[1:]:
        out[r["policy"]] = {
            key: round(value / base[key], 4) if base[key] else None
            for key, value in rows(r).items()
            if isinstance(value, int | float)
        }
    return out


def markdown(reports: list[dict[str, Any]]) -> str:
    """One table of every metric, one column per policy; with several, each cell after the first policy's also
    shows its ratio to the first (`0.5x`: half of it)."""
    lines = [f"# Simulation: {reports[0]['scenario']}", "", "| metric | " + " | ".join(r["policy"] for r in reports)
             + " |", "|---|" + "---|" * len(reports)]  # fmt: skip
    table = [rows(r) for r in reports]
    vs = ratios(reports)
    for key in table[0]:
        cells = [_fmt(table[0][key])]
        for r, flat in zip(reports[1:], table[1:], strict=True):
            ratio = vs[r["policy"]].get(key)
            cells.append(_fmt(flat[key]) + ("" if ratio is None else f" ({ratio:.2f}x)"))
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "Queueing: submission to first start, by GPUs asked (a job that never started counts its wait so "
              "far). Shortfall, fairness and waits within the guarantee: see `chamber.sim.quality`."]  # fmt: skip
    for r in reports:
        header = "| team | quota | jobs | avg JCT (h) | avg queue (h) | GPU-hours |"
        lines += ["", f"## {r['policy']}: per team", "", header, "|---|---|---|---|---|---|"]
        for team, t in r["teams"].items():
            lines.append(f"| {team} | {t['quota']} | {t['jobs']} | {t['avg_jct_s'] / 3600:.2f} | "
                         f"{t['avg_queue_s'] / 3600:.2f} | {t['gpu_hours']:.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if isinstance(value, float) and 0 < abs(value) < 0.01:
        return f"{value:.2g}"
    if isinstance(value, float):
        return f"{value:,.4g}" if value < 10 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def plots(sims: list[Simulation], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for sim in sims:
        days = [p["t"] / 86400 for p in sim.stats.series]
        ax1.plot(days, [p["busy"] / max(1, p["healthy"]) for p in sim.stats.series], label=sim.policy, lw=0.8)
        ax2.plot(days, [p["queue"] for p in sim.stats.series], label=sim.policy, lw=0.8)
    ax1.set_ylabel("GPU utilization")
    ax2.set_ylabel("jobs waiting")
    ax2.set_xlabel("day")
    ax1.legend()
    fig.tight_layout()
    written.append(out / "utilization_queue.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    for sim in sims:
        jct = sorted((j.finished_at - j.trace.submit_s) / 3600 for j in sim.jobs.values() if j.finished_at is not None)
        if jct:
            ax.plot(jct, [i / len(jct) for i in range(len(jct))], label=sim.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    fig.tight_layout()
    written.append(out / "jct_cdf.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    sim = sims[-1]
    teams = sorted(sim.book.teams) or sorted({j.trace.team for j in sim.jobs.values()})
    fig, ax = plt.subplots(figsize=(10, 5))
    days = [p["t"] / 86400 for p in sim.stats.series]
    for team in teams[:12]:
        line = ax.plot(days, [p["teams"].get(team, 0) for p in sim.stats.series], lw=0.8, label=team)
        quota = sum(q.nominal for (t, _), q in sim.book.quotas.items() if t == team)
        if quota:
            ax.axhline(quota, color=line[0].get_color(), ls=":", lw=0.6)
    ax.set_ylabel(f"GPUs allocated ({sim.policy}; dotted: quota)")
    ax.set_xlabel("day")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    written.append(out / "team_allocation.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def write(out: Path, reports: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = reports[0] if len(reports) == 1 else {"compare": reports, "ratios": ratios(reports)}
    (out / "report.json").write_bytes(msgspec.json.format(msgspec.json.encode(body)))
    (out / "report.md").write_text(markdown(reports))
