"""The policies on a small contended replay (`tests/data/philly-contended.yaml`): the shared FIFO queue is far
worse than Chamber, and under Chamber no job waits more than two days while its team is within its guarantee."""

from pathlib import Path

import pytest

from chamber.sim.run import simulate

SCENARIO = Path(__file__).parents[1] / "data" / "philly-contended.yaml"
TWO_DAYS = 2 * 86400


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("policies")
    done = simulate(str(SCENARIO), ["fifo", "chamber"], out, progress=False)
    return {r["policy"]: r for r in done}


def test_every_job_finishes_under_each_policy(reports: dict[str, dict]) -> None:  # type: ignore[type-arg]
    for report in reports.values():
        assert report["finished"] == report["jobs"] == 3000


def test_chamber_beats_the_shared_fifo_queue(reports: dict[str, dict]) -> None:  # type: ignore[type-arg]
    assert reports["chamber"]["avg_jct_s"] * 2 < reports["fifo"]["avg_jct_s"]
    assert reports["chamber"]["avg_queue_s"] * 2 < reports["fifo"]["avg_queue_s"]


def test_no_job_waits_two_days_while_its_team_is_within_its_guarantee(reports: dict[str, dict]) -> None:  # type: ignore[type-arg]
    assert reports["chamber"]["max_wait_within_guarantee_s"] < TWO_DAYS
    assert reports["chamber"]["guarantee_shortfall_entitled"] <= 0.001
