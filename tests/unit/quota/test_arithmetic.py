"""The pure quota arithmetic: validation, admission with lending and borrowing, reclaim, fair shares, decay."""

from dataclasses import dataclass

import pytest

from chamber.common.contracts import BudgetSpec, OrgConfig, PoolConfig, QuotaConfig, TeamConfig, TeamQuota
from chamber.common.quota import ConfigError, QuotaBook, admit, borrowed_jobs, decay, fair_shares, standings, validate


def config(*teams: TeamConfig, capacity: int = 16) -> QuotaConfig:
    return QuotaConfig(
        pools=[PoolConfig(name="h100", gpu_model="H100", capacity=capacity, cost_per_gpu_hour=2.0)],
        orgs=[OrgConfig(name="acme")],
        teams=list(teams),
    )


def team(name: str, nominal: int, *, borrow: int | None = None, lend: int | None = None, cohort: str = "c",
         weight: float = 1.0) -> TeamConfig:  # fmt: skip
    return TeamConfig(
        name=name, org="acme", cohort=cohort, weight=weight,
        quotas=[TeamQuota(pool="h100", nominal=nominal, borrowing_limit=borrow, lending_limit=lend)],
    )  # fmt: skip


@dataclass
class AdmitCase:
    name: str
    teams: list[TeamConfig]
    usage: dict[str, int]
    team: str
    gpus: int
    ok: bool
    borrowing: bool = False
    preemptible: bool = True
    says: str = ""
    capacity: int = 16


ADMIT = [
    AdmitCase("within nominal", [team("a", 8), team("b", 8)], {}, "a", 8, True),
    AdmitCase("borrow the cohort's idle quota", [team("a", 8), team("b", 8)], {"a": 8}, "a", 8, True, borrowing=True),
    AdmitCase(
        "cannot borrow what the lender uses",
        [team("a", 8), team("b", 8)],
        {"a": 8, "b": 6},
        "a",
        4,
        False,
        says="GPUs to lend",
    ),
    AdmitCase(
        "borrowing limit", [team("a", 8, borrow=2), team("b", 8)], {"a": 8}, "a", 4, False, says="borrowing limit"
    ),
    AdmitCase("lending limit", [team("a", 8), team("b", 8, lend=2)], {"a": 8}, "a", 4, False, says="GPUs to lend"),
    AdmitCase(
        "non-preemptible jobs never borrow",
        [team("a", 8), team("b", 8)],
        {"a": 8},
        "a",
        1,
        False,
        preemptible=False,
        says="only preemptible",
    ),
    AdmitCase(
        "other cohorts do not lend", [team("a", 8, cohort="x"), team("b", 8, cohort="y")], {"a": 8}, "a", 1, False
    ),
    AdmitCase(
        "unassigned capacity is lent to all",
        [team("a", 4), team("b", 4)],
        {"a": 4, "b": 4},
        "a",
        8,
        True,
        borrowing=True,
    ),
    AdmitCase(
        "a team's own idle quota is not lent to it a second time",
        [team("a", 8, cohort="x"), team("c", 8, cohort="y")],
        {"a": 6},
        "a",
        4,
        False,
        says="0 GPUs to lend",
    ),
    AdmitCase("its first GPUs fill its own idle quota", [team("a", 8), team("b", 8)], {"a": 6}, "a", 4, True, True),
    AdmitCase(
        "a cohort-mate lends no more than its lending limit",
        [team("a", 4), team("b", 4, lend=1)],
        {"a": 2},
        "a",
        4,
        False,
        says="have 1 GPUs to lend in h100, 2 needed",
        capacity=8,
    ),
    AdmitCase(
        "borrowers already hold the idle quota",
        [team("a", 4), team("b", 8), team("c", 4)],
        {"a": 8, "b": 0, "c": 4},
        "c",
        8,
        False,
    ),
]


@pytest.mark.parametrize("case", ADMIT, ids=[c.name for c in ADMIT])
def test_admission(case: AdmitCase) -> None:
    book = validate(config(*case.teams, capacity=case.capacity))
    usage = {(t, "h100"): n for t, n in case.usage.items()}
    adm = admit(book, usage, case.team, "h100", case.gpus, preemptible=case.preemptible)
    assert adm.ok == case.ok, adm
    if case.ok:
        assert adm.borrowing == case.borrowing
    assert case.says in adm.reason


@pytest.mark.parametrize(
    ("cfg", "problem"),
    [
        (config(team("a", 12), team("b", 8)), "above its capacity"),
        (config(team("a", 4), team("a", 4)), "declared twice"),
        (config(TeamConfig(name="a", org="nope")), "unknown organisation"),
        (config(TeamConfig(name="a", org="acme", quotas=[TeamQuota(pool="tpu", nominal=1)])), "unknown pool"),
        (config(team("a", 4, lend=6)), "lending_limit 6 > nominal 4"),
        (QuotaConfig(orgs=[OrgConfig(name="x", parent="y"), OrgConfig(name="y", parent="x")]), "cycle"),
        (config(TeamConfig(name="a", org="acme", budget=BudgetSpec())), "needs gpu_hours or money"),
        (config(TeamConfig(name="a", org="acme", priorities=["train", "urgent"])), "unknown priority class 'urgent'"),
    ],
    ids=[
        "over-capacity",
        "duplicate",
        "unknown-org",
        "unknown-pool",
        "lend-above-nominal",
        "org-cycle",
        "empty-budget",
        "unknown-priority-class",
    ],
)
def test_invalid_configurations_are_rejected(cfg: QuotaConfig, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        validate(cfg)


def test_jobs_beyond_nominal_are_the_borrowed_ones() -> None:
    book = validate(config(team("a", 4), team("b", 12)))
    running = [
        ("low-late", "a", "h100", 2, 50, 30.0),
        ("high", "a", "h100", 2, 100, 20.0),
        ("low-early", "a", "h100", 2, 50, 10.0),
    ]
    assert borrowed_jobs(book, running) == {"low-late"}


def test_two_hungry_teams_split_the_surplus_by_weight() -> None:
    book = validate(config(team("a", 0, weight=1), team("b", 0, weight=3), capacity=100))
    shares = fair_shares(book, {("a", "h100"): 1000, ("b", "h100"): 1000})
    assert shares[("a", "h100")] == pytest.approx(25)
    assert shares[("b", "h100")] == pytest.approx(75)


def test_nominal_is_guaranteed_before_the_surplus_is_shared() -> None:
    book = validate(config(team("a", 10), team("b", 2), capacity=20))
    shares = fair_shares(book, {("a", "h100"): 4, ("b", "h100"): 100})
    assert shares[("a", "h100")] == 4, "a gets its demand (below nominal)"
    assert shares[("b", "h100")] == 16, "b gets its nominal plus all that is left"


def test_recent_usage_lets_an_idle_team_catch_up() -> None:
    book = validate(config(team("a", 0), team("b", 0), capacity=100))
    demand = {("a", "h100"): 1000, ("b", "h100"): 1000}
    shares = fair_shares(book, demand, recent={"a": 40.0, "b": 0.0})
    assert shares[("b", "h100")] == pytest.approx(70)
    assert shares[("a", "h100")] == pytest.approx(30)
    later = fair_shares(book, demand, recent={"a": decay(40.0, 7 * 86400 * 10, 7 * 86400), "b": 0.0})
    assert later[("a", "h100")] == pytest.approx(50, abs=0.1), "the penalty fades with the half-life"


def test_standing_ranks_teams_below_their_share_first() -> None:
    shares = {("a", "p"): 10.0, ("b", "p"): 10.0}
    usage = {("a", "p"): 2, ("b", "p"): 15}
    s = standings(shares, usage)
    assert s["a"] > 0 > s["b"]


def test_hierarchy_paths() -> None:
    cfg = QuotaConfig(orgs=[OrgConfig(name="root"), OrgConfig(name="ml", parent="root")],
                      teams=[TeamConfig(name="nlp", org="ml")])  # fmt: skip
    assert QuotaBook(cfg).org_path("nlp") == ["ml", "root"]
