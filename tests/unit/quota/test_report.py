"""The quota service's accounting, from job records: GPU-hours and cost by pool and priority, budgets, org sums."""

import math

import pytest

from chamber.common.contracts import (
    TERMINAL_STATES,
    BudgetSpec,
    GpuRef,
    JobRecord,
    JobSpec,
    JobState,
    OrgConfig,
    Placement,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
)
from chamber.common.quota import QuotaBook
from chamber.quota.core.report import compute, org_totals, recent_gpus
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


def _ran_10h(job_id: str, state: JobState, *, requeued: bool) -> JobRecord:
    """8 GPUs for 10 hours up to a minute ago: finished, or preempted and requeued (the scheduler clears
    `started_at` and keeps `run_s`/`lost_s`), then perhaps cancelled while waiting."""
    return JobRecord(
        id=job_id, spec=JobSpec(name=job_id, team="a", gpus_per_replica=8), state=state, submitted_at=NOW - 40000,
        updated_at=NOW - 60, started_at=None if requeued else NOW - 36060,
        finished_at=NOW - 60 if state in TERMINAL_STATES else None,
        run_s=30000.0 if requeued else 36000.0, lost_s=6000.0 if requeued else 0.0, preemptions=int(requeued),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "requeued"),
    [(JobState.PREEMPTED, True), (JobState.CANCELLED, True), (JobState.PENDING, True), (JobState.SUCCEEDED, False)],
)
def test_recent_usage_counts_the_gpu_time_of_every_attempt(state: JobState, *, requeued: bool) -> None:
    """Fair share weighs the same GPU time the GPU-hours count, once: a requeued job's earlier runs still count
    (they end when it stopped), and a finished job's last attempt is not counted twice."""
    half_life = 7 * 86400.0
    k = math.log(2) / half_life
    ten_hours = 8 * (math.exp(-k * 60) - math.exp(-k * 36060))
    record = _ran_10h("j", state, requeued=requeued)
    assert recent_gpus(record, NOW, half_life) == pytest.approx(ten_hours)
    config = QuotaConfig(
        pools=[PoolConfig(name="p", gpu_model="H100")], orgs=[OrgConfig(name="o")], usage_half_life_s=half_life,
        teams=[TeamConfig(name=t, org="o", quotas=[TeamQuota(pool="p", nominal=0)]) for t in ("a", "b")],
    )  # fmt: skip
    waiting = [make_job(f"w{t}").team(t).gpus(8, replicas=2).pool("p").at(NOW).build() for t in ("a", "b")]
    teams = compute(QuotaBook(config, {"p": 16}), [record, *waiting], {}, NOW)
    assert teams["a"].gpu_hours == pytest.approx(80.0)
    assert teams["a"].fair_share < teams["b"].fair_share, "a used the fleet recently; b did not"
