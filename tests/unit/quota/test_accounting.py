"""The quota service's incremental accounting equals the from-scratch sum over all records, after any sequence of
job state changes, as time passes (running jobs' GPU time grows, recent usage decays, budget periods roll over)."""

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    TeamUsage,
)
from chamber.common.quota import QuotaBook
from chamber.quota.core.accounting import Accounting
from chamber.quota.core.report import compute, ended_at
from tests.support.builders import make_job

START = 1_800_000_000.0
DAY = 86400.0
NODE_POOL = {"n1": "p", "n2": "q"}  # n9 is not in the inventory
HALF_LIFE = 3 * 3600.0
"""Short, so that a few days of updates move the accounting's epoch several times."""


def book() -> QuotaBook:
    config = QuotaConfig(
        pools=[PoolConfig(name="p", gpu_model="H100", cost_per_gpu_hour=2.5),
               PoolConfig(name="q", gpu_model="A100", cost_per_gpu_hour=1.25)],
        orgs=[OrgConfig(name="acme")],
        teams=[
            TeamConfig(name="a", org="acme", cohort="x", weight=2.0,
                       quotas=[TeamQuota(pool="p", nominal=8), TeamQuota(pool="q", nominal=4)],
                       budget=BudgetSpec(gpu_hours=73.3, period="day", mode="block-all")),
            TeamConfig(name="b", org="acme", cohort="x", quotas=[TeamQuota(pool="p", nominal=4, lending_limit=2)],
                       budget=BudgetSpec(money=411.7, period="week")),
            TeamConfig(name="c", org="acme", cohort="y", quotas=[TeamQuota(pool="q", nominal=6)]),
        ],
        usage_half_life_s=HALF_LIFE,
    )  # fmt: skip
    return QuotaBook(config, {"p": 32, "q": 16})


times = st.floats(0, 6 * DAY, allow_nan=False)


@st.composite
def version(draw: st.DrawFn, job: str, number: int, end: float) -> JobRecord:
    """A plausible record of `job` whose times all lie before `end`."""
    state = draw(st.sampled_from(list(JobState)))
    placed = state == JobState.RUNNING or (state in (JobState.PENDING, JobState.PREEMPTED) and draw(st.booleans()))
    node = draw(st.sampled_from(["n1", "n2", "n9"]))
    started = START + draw(times)
    started = min(started, end)
    updated = min(end, started + draw(times))
    spec = JobSpec(name=job, team=draw(st.sampled_from(["a", "b", "c", "stranger"])),
                   gpus_per_replica=draw(st.sampled_from([1, 2, 4, 8])), replicas=draw(st.sampled_from([1, 2])),
                   priority=draw(st.sampled_from(["train", "research"])),
                   pool=draw(st.sampled_from([None, "p", "q"])))  # fmt: skip
    ran = state != JobState.PENDING or draw(st.booleans())
    requeued = state != JobState.RUNNING and ran and draw(st.booleans())
    """Preempted and requeued (then perhaps cancelled or failed): run time kept, `started_at` cleared."""
    return JobRecord(
        id=job, spec=spec, state=state, submitted_at=START, updated_at=updated, version=number,
        placement=Placement(attempt=1, gpus=[GpuRef(node, 0)]) if placed else None,
        started_at=started if (ran or placed) and not requeued else None,
        finished_at=updated if state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED) else None,
        run_s=draw(times) / 4 if ran else 0.0, lost_s=draw(st.floats(0, 3600)) if ran else 0.0,
    )  # fmt: skip


def settles(record: JobRecord, now: float) -> bool:
    """An ended job, its end not in the future: it never changes again, and the accounting lets its record go."""
    return record.state in TERMINAL_STATES and ended_at(record) <= now


@st.composite
def history(draw: st.DrawFn) -> tuple[list[tuple[float, JobRecord | None]], float]:
    """Record changes at increasing times (None: read the accounting then), and the time of the final check. A job
    whose newest record settled gets no more records (the state machine changes no ended job, and the service
    takes in each write once), but the others get repeats and stale versions too."""
    end = START + draw(st.floats(DAY, 7 * DAY))
    steps: list[tuple[float, JobRecord | None]] = []
    versions: dict[str, int] = {}
    newest: dict[str, int] = {}
    settled: set[str] = set()
    now = START
    for _ in range(draw(st.integers(1, 40))):
        now = min(end, now + draw(st.floats(0, DAY / 2)))
        job = f"j{draw(st.integers(0, 7))}"
        if job in settled or draw(st.integers(0, 4)) == 0:
            steps.append((now, None))
            continue
        versions[job] = versions.get(job, 0) + draw(st.integers(-1, 2))  # repeats and stale versions too
        record = draw(version(job, versions[job], end))
        steps.append((now, record))
        if record.version > newest.get(job, -(10**9)):
            newest[job] = record.version
            if settles(record, now):
                settled.add(job)
    return steps, end


def assert_same(incremental: dict[str, TeamUsage], scratch: dict[str, TeamUsage]) -> None:
    """Equal, up to float rounding: values are rounded to 4 decimals, so two sums that differ in their last bits
    may round one step apart (1e-4); the budget state is compared away from its thresholds for the same reason."""
    assert incremental.keys() == scratch.keys()
    for team, want in scratch.items():
        got = incremental[team]
        for name in TeamUsage.__struct_fields__:
            a, b = getattr(got, name), getattr(want, name)
            if name == "budget_state" and any(math.isclose(want.budget_used, x, abs_tol=1e-3) for x in (0.8, 1.0)):
                continue
            if isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-6, abs=2e-4), (team, name)
            elif isinstance(b, dict):
                assert a.keys() == b.keys(), (team, name)
                assert a == pytest.approx(b, rel=1e-6, abs=2e-4), (team, name)
            else:
                assert a == b, (team, name)


@settings(max_examples=300, deadline=None)
@given(history())
def test_incremental_accounting_equals_the_from_scratch_sum(case: tuple[list[tuple[float, JobRecord | None]], float]):
    steps, end = case
    b = book()
    acc = Accounting(b, NODE_POOL, START)
    latest: dict[str, JobRecord] = {}
    settled: set[str] = set()
    for now, record in steps:
        if record is None:
            acc.teams(now)
            continue
        acc.apply(record, now)
        known = latest.get(record.id)
        if known is None or known.version < record.version:
            latest[record.id] = record
            if settles(record, now):
                settled.add(record.id)
    assert acc.records == {job: r for job, r in latest.items() if job not in settled}  # only the jobs not ended
    assert_same(acc.teams(end), compute(b, latest.values(), NODE_POOL, end))


def test_a_running_job_accrues_gpu_hours_and_cost_without_any_change() -> None:
    b = book()
    spec = JobSpec(name="j", team="a", gpus_per_replica=4)
    running = JobRecord(id="j", spec=spec, state=JobState.RUNNING, submitted_at=START, updated_at=START,
                        placement=Placement(attempt=1, gpus=[GpuRef("n1", 0)]), started_at=START)  # fmt: skip
    acc = Accounting.build(b, NODE_POOL, [running], START)
    later = acc.teams(START + 1800)["a"]
    assert later.gpu_hours == pytest.approx(2.0)
    assert later.cost == pytest.approx(5.0)
    assert later.gpu_hours_by_pool == {"p": pytest.approx(2.0)}


def test_a_new_budget_day_starts_from_zero() -> None:
    b = book()
    spec = JobSpec(name="j", team="a", gpus_per_replica=8)
    end = START + 3 * 3600  # START is 08:00 UTC: the job ran from 01:00 to 11:00
    done = JobRecord(id="j", spec=spec, state=JobState.SUCCEEDED, submitted_at=START, updated_at=end,
                     started_at=end - 10 * 3600, finished_at=end, run_s=10 * 3600)  # fmt: skip
    acc = Accounting.build(b, NODE_POOL, [done], end + 60)
    assert acc.teams(end + 60)["a"].budget_state == "blocked-all", "80 GPU-hours of a 73.3 daily budget"
    assert acc.teams(START + 2 * DAY)["a"].budget_state == "ok"
    assert acc.teams(START + 2 * DAY)["a"].gpu_hours == pytest.approx(80.0), "the total stays"


def midnight(days_after_start: int) -> float:
    """00:00 UTC of the day `days_after_start` days after START's."""
    return START - START % DAY + days_after_start * DAY


@pytest.mark.parametrize("at_hour", [1.0, 2.5, 23.0])
def test_a_budget_period_counts_only_the_part_of_each_run_inside_it(at_hour: float) -> None:
    """8 GPUs running for 3 days, and 4 GPUs that ran 10 hours up to 02:00 today: the daily budget sees today's
    hours only (8 x hours since midnight + 4 x 2), incrementally as from scratch, however the job got there."""
    b = book()
    today = midnight(3)
    now = today + at_hour * 3600
    running = JobRecord(id="r", spec=JobSpec(name="r", team="a", gpus_per_replica=8), state=JobState.RUNNING,
                        submitted_at=today - 3 * DAY, updated_at=today - 3 * DAY, started_at=today - 3 * DAY,
                        placement=Placement(attempt=1, gpus=[GpuRef("n1", 0)]))  # fmt: skip
    ended = min(now, today + 2 * 3600)
    finished = JobRecord(id="f", spec=JobSpec(name="f", team="a", gpus_per_replica=4), state=JobState.SUCCEEDED,
                         submitted_at=ended - 10 * 3600, updated_at=ended, started_at=ended - 10 * 3600,
                         finished_at=ended, run_s=10 * 3600)  # fmt: skip
    expected = 8 * at_hour + 4 * (ended - today) / 3600
    scratch = compute(b, [running, finished], NODE_POOL, now)["a"]
    assert scratch.budget_used == pytest.approx(expected / 73.3, abs=1e-4)
    assert scratch.gpu_hours == pytest.approx(8 * (3 * 24 + at_hour) + 40), "the lifetime total is unchanged"
    built_days_ago = Accounting.build(b, NODE_POOL, [running], today - 2 * DAY)
    built_days_ago.apply(finished, ended)
    for acc in (Accounting.build(b, NODE_POOL, [running, finished], now), built_days_ago):
        assert_same(acc.teams(now), compute(b, [running, finished], NODE_POOL, now))


def test_a_waiting_reason_written_later_does_not_move_a_requeued_jobs_past_run() -> None:
    """A preempted, requeued job's run time ends when its attempt stopped (`stopped_at`), not when its record was
    last written: the scheduler writes a waiting job's record again whenever its reason changes (not announced on
    DECISIONS, but the quota service follows every write). Yesterday's 10 h must not count in today's budget."""
    midnight = (START // DAY + 1) * DAY
    stopped = midnight - 3600  # ran 10 h until 23:00, then preempted and requeued
    requeued = msgspec.structs.replace(
        make_job("x").team("a").gpus(4).pool("p").ran(10 * 3600).at(stopped - 10 * 3600).build(),
        state=JobState.PREEMPTED, updated_at=stopped, stopped_at=stopped, version=5,
    )  # fmt: skip
    noted = msgspec.structs.replace(requeued, updated_at=midnight + 6 * 3600, version=6, reason="waiting for GPUs",
                                    reason_kind="capacity")  # fmt: skip
    now = midnight + 7 * 3600
    before = Accounting.build(book(), NODE_POOL, [requeued], now).teams(now)["a"]
    after = Accounting.build(book(), NODE_POOL, [requeued, noted], now).teams(now)["a"]
    assert (after.budget_used, after.standing) == (before.budget_used, before.standing)
    assert before.budget_used == 0.0, "the whole run lies in yesterday"


def _finished(job: str, team: str, end: float, *, hours: float = 2.0, node: str | None = None) -> JobRecord:
    placement = Placement(attempt=1, gpus=[GpuRef(node, 0)]) if node else None
    return JobRecord(id=job, spec=JobSpec(name=job, team=team, gpus_per_replica=2, pool=None if node else "p"),
                     state=JobState.SUCCEEDED, submitted_at=end - hours * 3600, updated_at=end, version=4,
                     placement=placement, started_at=end - hours * 3600, finished_at=end,
                     run_s=hours * 3600)  # fmt: skip


def test_memory_holds_only_the_jobs_that_have_not_ended() -> None:
    """A thousand jobs that ended leave no record behind, and their GPU time stays in the sums; a job whose end
    lies in the future (a clock ahead) is kept until it is applied again."""
    b = book()
    now = START + DAY
    acc = Accounting(b, NODE_POOL, START)
    records = [_finished(f"j{i}", "abc"[i % 3], START + i * 60) for i in range(1000)]
    ahead = _finished("ahead", "a", now + 600)
    for r in [*records, ahead]:
        acc.apply(r, now)
    assert acc.records == {"ahead": ahead}
    assert_same(acc.teams(now + 3600), compute(b, [*records, ahead], NODE_POOL, now + 3600))


def test_a_job_that_ends_in_a_period_not_yet_looked_at_is_counted_in_it() -> None:
    """Team a's daily budget was last read before midnight; a job that ended after midnight settles at once, so its
    part after midnight is counted in the new day, not lost when the new day starts from the jobs kept."""
    b = book()
    day2 = midnight(2)
    acc = Accounting(b, NODE_POOL, START)
    acc.teams(day2 - 3600)
    late = _finished("late", "a", day2 + 1800, hours=2.0)  # 2 GPUs, 22:30 to 00:30: one GPU-hour after midnight
    acc.apply(late, day2 + 3600)
    got = acc.teams(day2 + 7200)["a"]
    assert got.budget_used == pytest.approx(1.0 / 73.3, abs=1e-4)
    assert_same(acc.teams(day2 + 7200), compute(b, [late], NODE_POOL, day2 + 7200))


def test_new_nodes_re_sum_the_jobs_not_ended_and_a_settled_job_on_an_unknown_node_is_named() -> None:
    """A node new to the inventory changes the pool only of jobs on it; a job that ended on a node not yet known
    was summed in no pool, so that node is named (the service reads every record again when it appears)."""
    b = book()
    now = START + DAY
    spec = JobSpec(name="r", team="a", gpus_per_replica=4)
    running = JobRecord(id="r", spec=spec, state=JobState.RUNNING, submitted_at=START, updated_at=START,
                        placement=Placement(attempt=1, gpus=[GpuRef("n3", 0)]), started_at=START)  # fmt: skip
    gone = _finished("g", "b", START + 3600, node="n4")
    acc = Accounting.build(b, NODE_POOL, [running, gone], now)
    assert acc.settled_on_unknown == {"n4"}
    nodes = {**NODE_POOL, "n3": "q"}
    acc.with_nodes(nodes)
    assert_same(acc.teams(now), compute(b, [running, gone], nodes, now))
