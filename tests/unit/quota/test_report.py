"""The quota service's accounting, from job records: GPU-hours and cost by pool and priority, budgets, org sums."""

import math
from datetime import UTC, datetime

import pytest

from chamber.common.contracts import (
    TERMINAL_STATES,
    BudgetSpec,
    GpuRef,
    JobCancelRequested,
    JobRecord,
    JobSpec,
    JobStarted,
    JobState,
    JobStopped,
    JobSubmitted,
    OrgConfig,
    Placement,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
)
from chamber.common.quota import QuotaBook, validate
from chamber.quota.core.accounting import Accounting
from chamber.quota.core.report import compute, org_totals, recent_gpus
from chamber.scheduler.core.lifecycle import apply_event, place
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


def test_a_job_cancelled_while_it_waited_is_charged_to_when_it_last_ran() -> None:
    """Found by review: a job ran 8 GPUs from 20:00 to 23:00 on day 1 and was preempted; cancelled while it waited
    on day 2, its cancel time (`finished_at`) was taken as when it last ran, and its 24 GPU-hours moved into day 2's
    budget (blocking the team, and resetting its decayed recent usage)."""

    def at(iso: str) -> float:
        return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()

    book = validate(QuotaConfig(
        pools=[PoolConfig(name="default", gpu_model="H100", cost_per_gpu_hour=2.0)], orgs=[OrgConfig(name="o")],
        teams=[TeamConfig(name="a", org="o", quotas=[TeamQuota(pool="default", nominal=8)],
                          budget=BudgetSpec(gpu_hours=30, period="day", mode="block-all"))],
    ), capacity={"default": 8})  # fmt: skip
    spec = JobSpec(name="j", team="a", gpus_per_replica=8, priority="research")
    submitted = apply_event(None, JobSubmitted(job_id="j", spec=spec, submitted_at=at("2026-03-01T19:00")), 0.0)
    assert submitted is not None
    record = place(submitted.record, Placement(attempt=1, gpus=[GpuRef("n0", i) for i in range(8)]), 0.0)
    for event in (JobStarted(job_id="j", attempt=1, started_at=at("2026-03-01T20:00")),
                  JobStopped(job_id="j", attempt=1, stopped_at=at("2026-03-01T23:00"))):  # fmt: skip
        moved = apply_event(record, event, event.started_at if isinstance(event, JobStarted) else event.stopped_at)
        assert moved is not None
        record = moved.record
    now = at("2026-03-02T09:00")
    cancelled = apply_event(record, JobCancelRequested(job_id="j", requested_at=now), now)
    assert cancelled is not None
    waiting = compute(book, [record], {"n0": "default"}, now)["a"]
    ended = compute(book, [cancelled.record], {"n0": "default"}, now + 1)["a"]
    assert (waiting.budget_used, waiting.budget_state) == (0.0, "ok")
    assert (ended.budget_used, ended.budget_state) == (0.0, "ok")
    assert recent_gpus(cancelled.record, now, 3600.0) == pytest.approx(recent_gpus(record, now, 3600.0))
    accounting = Accounting.build(book, {"n0": "default"}, [record], now)
    accounting.apply(cancelled.record, now + 1)
    assert accounting.teams(now + 1)["a"].budget_state == "ok"
