"""Teams and pools over HTTP: read the configuration with live usage, change it (validated, compare-and-set).

An invalid change (unknown pool or organisation, guarantees above capacity, negative values, a cycle in the
organisation tree) gets a 400 naming every problem, and the configuration in force is untouched.
"""

from collections.abc import Callable
from typing import Annotated, Literal

import msgspec
from litestar import get, put
from litestar.datastructures import State
from litestar.exceptions import ClientException, NotFoundException, ValidationException
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_409_CONFLICT

from chamber.common.contracts import (
    BudgetSpec,
    OrgUsage,
    PoolConfig,
    QuotaConfig,
    TeamConfig,
    TeamQuota,
    TeamUsage,
)
from chamber.common.contracts.quota import Gpus, Name
from chamber.common.quota import ConfigError, validate
from chamber.common.quotastore import StaleConfig
from chamber.gateway.state import GatewayState


class TeamBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    org: Name
    cohort: Name = "default"
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 1.0
    quotas: list[TeamQuota] = msgspec.field(default_factory=list)
    budget: BudgetSpec | None = None


class PoolBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    gpu_model: str
    cluster: str = "local"
    cost_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    capacity: Gpus | None = None


class TeamView(msgspec.Struct, kw_only=True):
    name: str
    config: TeamConfig | None
    usage: TeamUsage
    """nominal, usage, borrowed, lent, fair share, standing, GPU-hours, cost, budget used."""


class PoolView(msgspec.Struct, kw_only=True):
    name: str
    config: PoolConfig
    capacity: int
    nominal_total: int


def _gw(state: State) -> GatewayState:
    gw: GatewayState = state.gateway
    return gw


def _team_view(gw: GatewayState, config: QuotaConfig, name: str) -> TeamView | None:
    team = next((t for t in config.teams if t.name == name), None)
    usage = gw.quota_usage(name)
    if team is None and usage is None:
        return None
    return TeamView(name=name, config=team, usage=usage or TeamUsage(team=name))


@get("/v1/teams", summary="Teams with their quota, usage, fair share and budget")
async def list_teams(state: State) -> list[TeamView]:
    gw = _gw(state)
    config, _ = await gw.quota_store.get()
    names = sorted({t.name for t in config.teams} | set(gw.quota_teams()))
    return [v for n in names if (v := _team_view(gw, config, n)) is not None]


@get("/v1/teams/{name:str}", summary="One team")
async def get_team(name: FromPath[str], state: State) -> TeamView:
    gw = _gw(state)
    config, _ = await gw.quota_store.get()
    view = _team_view(gw, config, name)
    if view is None:
        raise NotFoundException(f"no team {name!r}")
    return view


@put("/v1/teams/{name:str}", summary="Create or change a team (admin)")
async def put_team(name: FromPath[str], data: JSONBody[TeamBody], state: State) -> TeamView:
    team = msgspec.convert({**msgspec.structs.asdict(data), "name": name}, TeamConfig, from_attributes=True)
    gw = _gw(state)
    config = await _change(gw, lambda c: _replace(c, "teams", team))
    view = _team_view(gw, config, name)
    assert view is not None
    return view


@get("/v1/pools", summary="Capacity pools")
async def list_pools(state: State) -> list[PoolView]:
    gw = _gw(state)
    config, _ = await gw.quota_store.get()
    return [_pool_view(gw, config, p) for p in config.pools]


@get("/v1/pools/{name:str}", summary="One capacity pool")
async def get_pool(name: FromPath[str], state: State) -> PoolView:
    gw = _gw(state)
    config, _ = await gw.quota_store.get()
    pool = next((p for p in config.pools if p.name == name), None)
    if pool is None:
        raise NotFoundException(f"no pool {name!r}")
    return _pool_view(gw, config, pool)


@put("/v1/pools/{name:str}", summary="Create or change a capacity pool (admin)")
async def put_pool(name: FromPath[str], data: JSONBody[PoolBody], state: State) -> PoolView:
    pool = msgspec.convert({**msgspec.structs.asdict(data), "name": name}, PoolConfig, from_attributes=True)
    gw = _gw(state)
    config = await _change(gw, lambda c: _replace(c, "pools", pool))
    return _pool_view(gw, config, pool)


def _pool_view(gw: GatewayState, config: QuotaConfig, pool: PoolConfig) -> PoolView:
    capacity = gw.pool_capacity().get(pool.name, pool.capacity or 0)
    nominal = sum(q.nominal for t in config.teams for q in t.quotas if q.pool == pool.name)
    return PoolView(name=pool.name, config=pool, capacity=capacity, nominal_total=nominal)


def _replace(config: QuotaConfig, field: Literal["teams", "pools"], item: TeamConfig | PoolConfig) -> QuotaConfig:
    items = [x for x in getattr(config, field) if x.name != item.name]
    return msgspec.structs.replace(config, **{field: [*items, item]})


async def _change(gw: GatewayState, edit: Callable[[QuotaConfig], QuotaConfig]) -> QuotaConfig:
    """Apply `edit` to the stored configuration: validate, then compare-and-set (retried once if raced)."""
    for _ in range(2):
        current, revision = await gw.quota_store.get()
        changed = edit(current)
        try:
            validate(changed, gw.pool_capacity())
        except ConfigError as exc:
            raise ValidationException(f"invalid quota configuration: {exc}") from exc
        try:
            await gw.quota_store.put(changed, revision)
        except StaleConfig:
            continue
        return changed
    raise ClientException("the quota configuration changed meanwhile; try again", status_code=HTTP_409_CONFLICT)


@get("/v1/orgs", summary="Organisations with the sums of the teams below them")
async def list_orgs(state: State) -> list[OrgUsage]:
    quota = _gw(state).quota_state
    return [] if quota is None else list(quota.orgs.values())


ROUTES = [list_teams, get_team, put_team, list_pools, get_pool, put_pool, list_orgs]
