"""The simulator's data: the shipped trace read as .csv.gz, durations kept as given, simulated user estimates,
bursts, large gangs and notebooks, the contended scenarios, and the quality metrics on cases worked by hand."""

import gzip
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from chamber.sim.engine import Simulation
from chamber.sim.quality import Timeline, guarantees, jain, queueing_by_size
from chamber.sim.report import summarize
from chamber.sim.run import simulate
from chamber.sim.scenario import (
    EstimateSpec,
    FleetSpec,
    NotebookSpec,
    PoolSpec,
    ReplicateRule,
    Scenario,
    ScenarioError,
    TeamSpec,
    TraceJob,
    WorkloadSpec,
    load,
    read_trace,
)
from chamber.sim.synth import estimate, notebooks, replicate

ROOT = Path(__file__).parents[2]
SCENARIOS = ROOT / "scenarios"
CONTENDED = sorted(
    p.name for p in SCENARIOS.glob("philly-*.yaml") if p.stem not in ("philly-isolated", "philly-shared")
)
HEADER = "job_id,submit_time_s,duration_s,num_gpus,user_or_team\n"


def scenario_file(tmp_path: Path, trace: str, extra: str = "") -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nfleet: {pools: [{name: p, nodes: 1, gpus_per_node: 8}]}\n"
        f"teams: [{{name: a, quota: {{p: 8}}}}]\nworkload: {{trace: {trace}{extra}}}\n"
    )
    return path


def test_a_gzip_trace_reads_like_the_plain_one_and_keeps_sub_second_durations(tmp_path: Path) -> None:
    rows = HEADER + "0,0,0.25,1,a\n1,5,0,2,a\n2,7,3600.5,8,a\n"
    (tmp_path / "t.csv").write_text(rows)
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write(rows)
    plain = read_trace(*load(scenario_file(tmp_path, "t.csv")))
    packed = read_trace(*load(scenario_file(tmp_path, "t.csv.gz")))
    assert plain == packed
    assert [j.duration_s for j in packed] == [0.25, 0.0, 3600.5]


def test_sub_second_and_zero_durations_simulate_to_the_end(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(HEADER + "".join(f"{i},{i * 0.1:.1f},{i % 3 * 0.2:.1f},8,a\n" for i in range(20)))
    scenario, base = load(scenario_file(tmp_path, "t.csv"), ["cycle_interval_s=0.05"])
    sim = Simulation(scenario, read_trace(scenario, base), "chamber")
    sim.run()
    assert sim.done == 20
    # 20 jobs each needing the whole node, one after the other: nothing rounds them up to a second.
    assert sim.now < 20 * 0.2 + 2.0


def test_negative_durations_and_broken_gzip_get_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(HEADER + "0,0,-1,1,a\n")
    with pytest.raises(ScenarioError, match="line 2: duration_s must not be negative"):
        read_trace(*load(scenario_file(tmp_path, "t.csv")))
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(ScenarioError, match="cannot read trace"):
        read_trace(*load(scenario_file(tmp_path, "bad.csv.gz")))


def test_the_shipped_trace_is_the_whole_philly_trace() -> None:
    scenario, base = load(SCENARIOS / "philly-shared.yaml")
    jobs = read_trace(scenario, base)
    assert len(jobs) == 82_247
    assert len({j.team for j in jobs}) == 15
    assert max(j.gpus for j in jobs) == 128


def test_user_estimates_are_deterministic_overestimates_with_some_missing() -> None:
    spec = EstimateSpec(model="user", missing=0.3, median_factor=3.0, sigma=1.0, round_up=False, seed=7)
    ids = [str(i) for i in range(4000)]
    first = [estimate(spec, i, 1000.0) for i in ids]
    assert first == [estimate(spec, i, 1000.0) for i in ids], "the same job gets the same estimate every time"
    assert first != [estimate(EstimateSpec(model="user", missing=0.3, seed=8), i, 1000.0) for i in ids]
    given = [e for e in first if e is not None]
    assert abs(1 - len(given) / len(ids) - 0.3) < 0.03
    factors = [e / 1000.0 for e in given]
    assert 2.7 < statistics.median(factors) < 3.3
    # log-normal(ln 3, 1): P(factor < 1) = Phi(-ln 3) = 13.6%
    assert abs(sum(f < 1 for f in factors) / len(factors) - 0.136) < 0.025
    assert all(e > 0 for e in given)


def test_rounded_estimates_are_limits_people_type_and_never_below_the_draw() -> None:
    rounded = EstimateSpec(model="user", seed=3)
    raw = EstimateSpec(model="user", seed=3, round_up=False)
    for i in range(500):
        r, x = estimate(rounded, str(i), 5000.0), estimate(raw, str(i), 5000.0)
        assert r is not None
        assert x is not None
        assert r >= x
        assert r % 300 == 0
    assert estimate(EstimateSpec(model="exact"), "1", 42.0) == 42.0
    assert estimate(EstimateSpec(model="exact"), "1", 0.0) == pytest.approx(1e-3)
    assert estimate(EstimateSpec(), "1", 42.0) is None
    assert estimate(EstimateSpec(), "1", 42.0, factor=1.5) == 63.0


def test_an_estimate_never_stops_a_job(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(HEADER + "".join(f"{i},{i * 60},{3600 + i},2,a\n" for i in range(12)))
    extra = ", estimates: {model: user, median_factor: 0.1, sigma: 0.1, round_up: false}"
    scenario, base = load(scenario_file(tmp_path, "t.csv", extra))
    sim = Simulation(scenario, read_trace(scenario, base), "chamber")
    assert all(j.spec.max_runtime_s is not None and j.spec.max_runtime_s < 400 for j in sim.jobs.values())
    sim.run()
    for job in sim.jobs.values():
        assert job.finished_at is not None
        assert sum(b - a for a, b in job.runs) >= job.trace.duration_s - 1e-6


def _job(i: int, submit: float, gpus: int = 1, team: str = "a") -> TraceJob:
    return TraceJob(str(i), submit, 100.0, gpus, team, "train", True)


def test_replicate_adds_jittered_copies_inside_the_window_deterministically() -> None:
    jobs = [_job(i, i * 1000.0, gpus=1 + i % 16) for i in range(100)]
    burst = ReplicateRule(copies=3, from_s=20_000, to_s=40_000, jitter_s=5000)
    copies = replicate(jobs, [burst])
    assert copies == replicate(jobs, [burst])
    assert len(copies) == 2 * 20
    assert all(20_000 <= c.submit_s < 40_000 and c.kind == "copy" for c in copies)
    assert len({c.id for c in copies} | {j.id for j in jobs}) == 140
    wide = replicate(jobs, [ReplicateRule(copies=4, min_gpus=9, jitter_s=100)])
    assert len(wide) == 3 * sum(j.gpus >= 9 for j in jobs)
    assert all(c.gpus >= 9 for c in wide)
    assert any(abs(c.submit_s - float(c.id.split("-")[0]) * 1000) > 1 for c in wide), "copies are jittered"


def test_notebooks_arrive_at_their_rate_for_teams_with_a_guarantee() -> None:
    jobs = [_job(0, 0.0), _job(1, 100 * 86400.0)]
    teams = [TeamSpec(name="a", quota={"p": 24}), TeamSpec(name="b", quota={"p": 8}), TeamSpec(name="c")]
    spec = NotebookSpec(per_day=10, gpus=[1, 2], median_s=3600, max_s=86400)
    nbs = notebooks(jobs, teams, spec)
    assert nbs == notebooks(jobs, teams, spec)
    assert 850 < len(nbs) < 1150
    assert {n.team for n in nbs} == {"a", "b"}
    assert 0.65 < sum(n.team == "a" for n in nbs) / len(nbs) < 0.85
    assert all(n.kind == "notebook" and n.priority == "inference" and not n.preemptible for n in nbs)
    assert all(0 < n.duration_s <= 86400 and n.gpus in (1, 2) for n in nbs)
    assert 2700 < statistics.median(n.duration_s for n in nbs) < 4800


@pytest.mark.parametrize("name", CONTENDED)
def test_each_contended_scenario_loads_and_a_short_window_simulates(name: str, tmp_path: Path) -> None:
    assert len(CONTENDED) >= 6
    (report,) = simulate(str(SCENARIOS / name), ["chamber"], tmp_path, ["workload.limit=300"], progress=False)
    assert report["jobs"] >= 300
    assert report["finished"] == report["jobs"]
    assert set(report["queue_by_size"]) == {"1", "2-8", "9-32", "33+"}
    if "notebooks" in name:
        assert report["notebooks"] > 0
        assert report["notebook_gpu_hours"] > 0


def tiny(teams: list[TeamSpec], jobs: list[TraceJob], policy: str = "chamber") -> dict[str, Any]:
    scenario = Scenario(
        name="tiny", fleet=FleetSpec(pools=[PoolSpec(name="p", nodes=1, gpus_per_node=8)]), teams=teams,
        workload=WorkloadSpec(trace="-"),
    )  # fmt: skip
    sim = Simulation(scenario, jobs, policy)
    return summarize(sim, sim.run())


def test_the_report_on_a_case_worked_by_hand() -> None:
    # One node; team a (guarantee 8) submits two whole-node jobs of an hour at once: the second waits an hour.
    jobs = [TraceJob("j1", 0.0, 3600.0, 8, "a", "train", True), TraceJob("j2", 0.0, 3600.0, 8, "a", "train", True)]
    r = tiny([TeamSpec(name="a", quota={"p": 8})], jobs)
    assert (r["jobs"], r["finished"], r["unfinished"]) == (2, 2, 0)
    assert r["queue_by_size"]["2-8"] == {"jobs": 2, "never_started": 0, "avg_s": 1800.0, "p99_s": 3600.0,
                                          "max_s": 3600.0}  # fmt: skip
    assert r["queue_by_size"]["1"]["jobs"] == 0
    assert r["guarantee_shortfall"] == 0.0, "the team held its whole guarantee while it waited"
    assert r["max_wait_within_guarantee_s"] == 0.0, "j2 never fitted the guarantee while it waited"
    assert r["jain_fairness"] == 1.0
    assert r["contended_hours"] == 0


def test_compare_writes_every_metric_with_its_ratio_to_the_first_policy(tmp_path: Path) -> None:
    simulate(str(ROOT / "tests" / "data" / "small-scenario.yaml"), ["fifo", "chamber"], tmp_path, progress=False)
    body = json.loads((tmp_path / "report.json").read_text())
    fifo, chamber = body["compare"]
    ratios = body["ratios"]["chamber"]
    assert ratios["avg_jct_s"] == pytest.approx(chamber["avg_jct_s"] / fifo["avg_jct_s"], rel=1e-3)
    assert "queue_2-8_p99_s" in ratios
    for key in ("guarantee_shortfall", "jain_fairness", "max_wait_within_guarantee_s", "queue_by_size"):
        assert key in chamber
    md = (tmp_path / "report.md").read_text()
    assert "| queue_9-32_avg_s |" in md
    assert "x) |" in md


def tl(
    i: str, team: str, gpus: int, submitted: float, runs: list[tuple[float, float]], *, done: bool = True
) -> Timeline:
    return Timeline(i, team, gpus, submitted, tuple(runs), runs[-1][1] if done and runs else None)


def test_shortfall_counts_episodes_longer_than_30_minutes_over_active_team_time() -> None:
    jobs = [
        tl("a1", "a", 8, 0, [(3600, 7200)]),  # a short for an hour: counts
        tl("a2", "a", 8, 7200, [(8200, 9000)]),  # a short for 1,000 s: too brief to count
        tl("b1", "b", 8, 0, [(0, 9000)]),  # b never short
        tl("c1", "c", 8, 0, [(7200, 9000)]),  # c (guarantee 4) waits with an 8-GPU job no guarantee starts
    ]
    q = guarantees(jobs, {"a": 8, "b": 8, "c": 4, "none": 0}, 0.0, 9000.0)
    active = 9000 * 3
    assert q["guarantee_shortfall"] == pytest.approx(round((3600 + 7200) / active, 5))
    assert q["guarantee_shortfall_entitled"] == pytest.approx(round(3600 / active, 5))
    assert q["team_shortfall"]["c"] == {"active_h": 2.5, "short_h": 2.0, "entitled_short_h": 0.0}
    assert q["max_wait_within_guarantee_s"] == 3600.0
    assert q["max_wait_within_guarantee_job"] == "a1"


def test_jain_is_taken_over_teams_with_waiting_jobs_at_hourly_instants() -> None:
    jobs = [
        tl("a-run", "a", 8, 0, [(0, 10800)]),
        tl("a-wait", "a", 8, 0, [(10800, 14400)]),
        tl("b-wait", "b", 8, 0, [(10800, 14400)]),
    ]
    q = guarantees(jobs, {"a": 8, "b": 8}, 0.0, 14400.0)
    assert q["contended_hours"] == 3  # at 0, 1 h and 2 h both teams have a job waiting; a holds 8, b nothing
    assert q["jain_fairness"] == 0.5
    assert jain([1, 1, 1, 1]) == 1.0
    assert jain([1, 0, 0, 0]) == 0.25
    assert jain([1, 2]) == pytest.approx(0.9)


def test_unstarted_jobs_count_their_wait_until_the_end() -> None:
    jobs = [tl("x", "a", 1, 0, [(10, 20)]), tl("y", "a", 1, 0, [(20, 30)]), tl("z", "a", 40, 5, [], done=False)]
    by_size = queueing_by_size(jobs, 1005.0)
    assert by_size["1"] == {"jobs": 2, "never_started": 0, "avg_s": 15.0, "p99_s": 20.0, "max_s": 20.0}
    assert by_size["33+"] == {"jobs": 1, "never_started": 1, "avg_s": 1000.0, "p99_s": 1000.0, "max_s": 1000.0}
    assert not math.isnan(by_size["2-8"]["avg_s"])


def test_hourly_samples_carry_each_teams_demand() -> None:
    scenario = Scenario(
        name="tiny", fleet=FleetSpec(pools=[PoolSpec(name="p", nodes=1, gpus_per_node=8)]),
        teams=[TeamSpec(name="a", quota={"p": 8})], workload=WorkloadSpec(trace="-"),
    )  # fmt: skip
    jobs = [TraceJob("j1", 0.0, 5000.0, 8, "a", "train", True), TraceJob("j2", 0.0, 3600.0, 8, "a", "train", True)]
    sim = Simulation(scenario, jobs, "kueue")
    sim.run()
    hour = next(s for s in sim.stats.series if s["t"] == 3600.0)
    assert hour["teams"] == {"a": 8}
    assert hour["demand"] == {"a": 16}, "one job running, one waiting"
