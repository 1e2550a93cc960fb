"""The quota service's accounting, from job records: GPU-hours and cost by pool and priority, budgets, org sums."""

import pytest

from chamber.common.contracts import (
    BudgetSpec,
    GpuRef,
    JobState,
    OrgConfig,
    Placement,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
)
from chamber.common.quota import QuotaBook
from chamber.quota.core.report import compute, org_totals
from tests.support.builders import make_job

NOW = 1_800_000_000.0


def book(mode: str = "warn", money: float = 100.0) -> QuotaBook:
    config = QuotaConfig(
        pools=[PoolConfig(name="h100", gpu_model="H100", cost_per_gpu_hour=3.0)],
        orgs=[OrgConfig(name="acme"), OrgConfig(name="research", parent="acme")],
        teams=[
            TeamConfig(name="nlp", org="research", quotas=[TeamQuota(pool="h100", nominal=8)],
                       budget=BudgetSpec(money=money, period="day", mode=mode)),  # type: ignore[arg-type]
            TeamConfig(name="web", org="acme", quotas=[TeamQuota(pool="h100", nominal=8)]),
        ],
    )  # fmt: skip
    return QuotaBook(config, {"h100": 32})


def finished(job_id: str, team: str, gpus: int, hours: float, priority: str = "train"):
    import msgspec

    r = make_job(job_id).team(team).gpus(gpus).priority(priority).running_on(("n1", 0)).build()
    return msgspec.structs.replace(
        r, state=JobState.SUCCEEDED, run_s=hours * 3600, finished_at=NOW - 60, updated_at=NOW - 60,
        placement=Placement(attempt=1, gpus=[GpuRef("n1", i) for i in range(gpus)]),
    )  # fmt: skip


def test_accounting_by_pool_and_priority() -> None:
    records = [finished("a", "nlp", 4, 2.0), finished("b", "nlp", 2, 1.0, "research")]
    teams = compute(book(), records, {"n1": "h100"}, NOW)
    nlp = teams["nlp"]
    assert nlp.gpu_hours == pytest.approx(10.0)
    assert nlp.cost == pytest.approx(30.0)
    assert nlp.gpu_hours_by_pool == {"h100": pytest.approx(10.0)}
    assert nlp.gpu_hours_by_priority == {"train": pytest.approx(8.0), "research": pytest.approx(2.0)}


@pytest.mark.parametrize(
    ("mode", "money", "state"),
    [("warn", 100.0, "ok"), ("warn", 35.0, "warn"), ("warn", 20.0, "warn"),
     ("block-preemptible", 20.0, "blocked-preemptible"), ("block-all", 20.0, "blocked-all")],
)  # fmt: skip
def test_budget_states(mode: str, money: float, state: str) -> None:
    teams = compute(book(mode, money), [finished("a", "nlp", 4, 2.5)], {"n1": "h100"}, NOW)
    assert teams["nlp"].budget_state == state


def test_organisations_sum_their_teams_at_every_level() -> None:
    b = book()
    teams = compute(b, [finished("a", "nlp", 4, 2.0), finished("b", "web", 1, 1.0)], {"n1": "h100"}, NOW)
    orgs = org_totals(b, teams)
    assert orgs["research"].gpu_hours == pytest.approx(8.0)
    assert orgs["acme"].gpu_hours == pytest.approx(9.0)
    assert orgs["acme"].nominal == 16
    assert orgs["acme"].teams == 2
