"""Quota configuration (owned by the quota service, stored in JetStream KV) and the quota state it publishes."""

from typing import Annotated, Literal

import msgspec

from chamber.common.contracts.base import Contract, Event

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$(?!\n)")]
KubeNamespace = Annotated[
    str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$(?!\n)")
]
"""A Kubernetes namespace name (an RFC 1123 label)."""
"""`(?!\n)`: Python's `$` also matches before a final newline ("ml\n" would pass and reach KV keys and NATS
subjects); JSON Schema readers (ECMA-262) read the same pattern the same way."""
MAX_GPUS = 2**31 - 1
"""The largest GPU count the gRPC API carries (int32). Counts in the configuration are bounded by it, and
validation keeps the sums published per team (its guarantees over all pools) within it too, which a pool whose
capacity is not known yet cannot do. Generous on purpose: a stored configuration above it no longer decodes."""
Gpus = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS)]
MAX_PRICE = 1e6
BUDGET_RANGE = (1e-3, 1e15)
Price = Annotated[float, msgspec.Meta(ge=0, le=MAX_PRICE)]
"""Per GPU-hour, as a new configuration may set it (the API's bodies; `validate` for a file). Bounded above so that
costs (GPU-hours x price, summed over every team's history) stay finite: an unbounded price made a team's cost
overflow to inf, which JSON cannot carry, and every quota state published after it failed to decode. Not on the
stored contract: a configuration stored before the bound must still decode."""
BudgetAmount = Annotated[float, msgspec.Meta(ge=BUDGET_RANGE[0], le=BUDGET_RANGE[1])]
"""GPU-hours or money, as a new configuration may set them. Bounded below so that the share used (spent / budget)
stays finite: a budget of 5e-324 made it inf, with the same effect."""


class PoolConfig(Contract, frozen=True):
    """A capacity pool: one GPU model in one cluster, with its price. Capacity comes from the inventory."""

    name: Name
    gpu_model: str
    cluster: str = "local"
    cost_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    capacity: Gpus | None = None
    """Declared capacity, used until the inventory reports the pool's GPUs."""


class TeamQuota(Contract, frozen=True):
    pool: Name
    nominal: Gpus = 0
    """Guaranteed GPUs: the team gets min(nominal, demand), reclaiming borrowed capacity if it must."""
    borrowing_limit: Gpus | None = None
    """At most this many GPUs above nominal; None: as many as the cohort can lend."""
    lending_limit: Gpus | None = None
    """At most this many idle nominal GPUs lent to the cohort; None: all idle nominal."""


class BudgetSpec(Contract, frozen=True):
    gpu_hours: Annotated[float, msgspec.Meta(gt=0)] | None = None
    money: Annotated[float, msgspec.Meta(gt=0)] | None = None
    period: Literal["day", "week", "month"] = "month"
    mode: Literal["warn", "block-preemptible", "block-all"] = "warn"


class OrgConfig(Contract, frozen=True):
    name: Name
    parent: Name | None = None


class TeamConfig(Contract, frozen=True):
    name: Name
    org: Name
    cohort: Name = "default"
    """Teams of one cohort lend idle nominal quota to each other."""
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 1.0
    quotas: list[TeamQuota] = msgspec.field(default_factory=list)
    budget: BudgetSpec | None = None
    namespaces: list[KubeNamespace] = msgspec.field(default_factory=list)
    """Kubernetes namespaces whose labelled workloads (`chamber.io/team: <this team>`) may run as this team; the
    webhook refuses the others. Empty: any namespace Chamber watches, so on a shared cluster anyone who may
    create a Job there could spend this team's quota (Kueue ties a namespace to its queue the same way)."""
    priorities: list[Name] = msgspec.field(default_factory=list)
    """The priority classes this team's jobs may ask for (e.g. `[train, research, best-effort]` keeps a team's
    members off `inference`, which preempts the others' work and is never preempted); a job asking for another
    is refused at submit (API, gRPC and the Kubernetes webhook), as Slurm limits an association to its allowed
    QOS. Empty: every class."""


class QuotaConfig(Contract, frozen=True):
    pools: list[PoolConfig] = msgspec.field(default_factory=list)
    orgs: list[OrgConfig] = msgspec.field(default_factory=list)
    teams: list[TeamConfig] = msgspec.field(default_factory=list)
    usage_half_life_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 86400.0
    """Recent usage counts against a team's fair share, halving every this many seconds."""


class TeamUsage(Contract, frozen=True):
    team: str
    gpus_running: int = 0
    jobs_running: int = 0
    jobs_pending: int = 0
    gpus_pending: int = 0
    nominal: int = 0
    borrowed: int = 0
    lent: int = 0
    fair_share: float = 0.0
    standing: float = 0.0
    """Positive: below its fair share (goes first); negative: above it."""
    gpu_hours: float = 0.0
    cost: float = 0.0
    budget_used: float = 0.0
    """Share of the budget used this period (1.0 = exhausted)."""
    budget_state: Literal["none", "ok", "warn", "blocked-preemptible", "blocked-all"] = "none"
    gpu_hours_by_pool: dict[str, float] = msgspec.field(default_factory=dict)
    gpu_hours_by_priority: dict[str, float] = msgspec.field(default_factory=dict)
    org: str = ""


class OrgUsage(Contract, frozen=True):
    """An organisation's totals: the sums over every team below it in the hierarchy."""

    org: str
    teams: int = 0
    nominal: int = 0
    gpus_running: int = 0
    borrowed: int = 0
    gpu_hours: float = 0.0
    cost: float = 0.0


class QuotaState(Event, frozen=True):
    teams: dict[str, TeamUsage]
    computed_at: float
    orgs: dict[str, OrgUsage] = msgspec.field(default_factory=dict)
