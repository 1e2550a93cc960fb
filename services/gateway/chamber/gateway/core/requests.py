"""Request bodies the API accepts: strict (unknown fields refused), derived from the contracts they become, so a
field added to a contract is accepted by the API at once and the two cannot drift.

`SubmitJobRequest` *is* a `JobSpec` (a subclass that forbids unknown fields and spells the priority classes out
as an enum); `TeamBody` and `PoolBody` are `TeamConfig` and `PoolConfig` without the name (it is in the path).
"""

from typing import Annotated, Literal

import msgspec

from chamber.common.contracts import BudgetSpec, FaultInjection, JobSpec, PoolConfig, TeamConfig, TeamQuota, Topology
from chamber.common.contracts.quota import BudgetAmount, Gpus, KubeNamespace, Name, Price
from chamber.gateway.core.authz import Role

Priority = Literal["inference", "train", "research", "best-effort"]
"""The priority classes (chamber.common.priorities.DEFAULT_CLASSES; a test keeps the two equal)."""


class TopologyBody(Topology, frozen=True, forbid_unknown_fields=True):
    pass


class SubmitJobRequest(JobSpec, frozen=True, forbid_unknown_fields=True):
    """A job to run: a gang of `replicas`, each `gpus_per_replica` GPUs on one node (see docs/api.md)."""

    priority: Priority = "train"
    topology: TopologyBody | None = None

    def to_spec(self) -> JobSpec:
        fields = {name: getattr(self, name) for name in JobSpec.__struct_fields__}
        if self.topology is not None:
            fields["topology"] = Topology(level=self.topology.level, required=self.topology.required)
        return JobSpec(**fields)


class TeamQuotaBody(TeamQuota, frozen=True, forbid_unknown_fields=True):
    pass


class BudgetBody(BudgetSpec, frozen=True, forbid_unknown_fields=True):
    gpu_hours: BudgetAmount | None = None
    money: BudgetAmount | None = None


class TeamBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole team (PUT replaces it: a field left out takes its default)."""

    org: Name
    cohort: Name = "default"
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 1.0
    quotas: list[TeamQuotaBody] = msgspec.field(default_factory=list)
    budget: BudgetBody | None = None
    namespaces: list[KubeNamespace] = msgspec.field(default_factory=list)

    def to_config(self, name: str) -> TeamConfig:
        return msgspec.convert({**msgspec.to_builtins(self), "name": name}, TeamConfig)


class TeamPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Some fields of a team (PATCH): those present replace the stored ones; `budget: null` removes the budget."""

    org: Name | msgspec.UnsetType = msgspec.UNSET
    cohort: Name | msgspec.UnsetType = msgspec.UNSET
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] | msgspec.UnsetType = msgspec.UNSET
    quotas: list[TeamQuotaBody] | msgspec.UnsetType = msgspec.UNSET
    budget: BudgetBody | msgspec.UnsetType | None = msgspec.UNSET
    namespaces: list[KubeNamespace] | msgspec.UnsetType = msgspec.UNSET

    def apply(self, team: TeamConfig) -> TeamConfig:
        changes = {k: v for k, v in msgspec.structs.asdict(self).items() if v is not msgspec.UNSET}
        return msgspec.convert({**msgspec.to_builtins(team), **msgspec.to_builtins(changes)}, TeamConfig)


class PoolBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A whole capacity pool (PUT replaces it)."""

    gpu_model: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    cluster: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "local"
    cost_per_gpu_hour: Price = 0.0
    capacity: Gpus | None = None

    def to_config(self, name: str) -> PoolConfig:
        return msgspec.convert({**msgspec.to_builtins(self), "name": name}, PoolConfig)


class PoolPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    gpu_model: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | msgspec.UnsetType = msgspec.UNSET
    cluster: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | msgspec.UnsetType = msgspec.UNSET
    cost_per_gpu_hour: Price | msgspec.UnsetType = msgspec.UNSET
    capacity: Gpus | msgspec.UnsetType | None = msgspec.UNSET

    def apply(self, pool: PoolConfig) -> PoolConfig:
        changes = {k: v for k, v in msgspec.structs.asdict(self).items() if v is not msgspec.UNSET}
        return msgspec.convert({**msgspec.to_builtins(pool), **changes}, PoolConfig)


class OperatorOrder(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(max_length=500)] = ""
    gpu: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    """One GPU of the node; the whole node when absent."""


FaultKind = Literal["xid", "dbe", "row_remap_failure", "nvlink_replay", "thermal", "heartbeat_loss", "clear"]


class FaultRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A fault for the simulated fleet to show (validated like a cordon: known node, GPU index in range)."""

    node: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    fault: FaultKind
    gpu: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    value: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    """The XID number for `xid`; otherwise how strong (e.g. replay errors per second)."""
    duration_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)] | None = None

    def to_event(self) -> FaultInjection:
        return FaultInjection(node=self.node, fault=self.fault, gpu=self.gpu, value=self.value,
                              duration_s=self.duration_s)  # fmt: skip


MAX_TOKEN_LIFE_S = 10 * 365 * 86400.0


class TokenRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._@-]*$(?!\n)")]
    role: Role
    teams: Annotated[list[Name], msgspec.Meta(max_length=64)] = msgspec.field(default_factory=list)
    """Members only: the teams whose jobs it submits, cancels and reads (at least one)."""
    expires_in_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_TOKEN_LIFE_S)] | None = None
    """Seconds until the token is refused (at most ten years); none: it lasts until revoked."""
