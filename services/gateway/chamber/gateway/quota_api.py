"""Teams and pools over HTTP: read the configuration with live usage; create, replace (PUT), change some fields
(PATCH) or delete them (admins), each validated and written with compare-and-set.

A change that leaves the configuration inconsistent (an unknown pool or organisation, guarantees above capacity)
gets a 422 naming every problem; a malformed one a 400; a pool that teams still use cannot be deleted (409). The
configuration in force is untouched in every case.
"""

import re
from collections.abc import Callable
from typing import Any, Literal

import msgspec
from litestar import Request, delete, get, patch, put
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_204_NO_CONTENT

from chamber.common.bus.errors import BusError
from chamber.common.contracts import OrgUsage, PoolConfig, QuotaConfig, TeamConfig, TeamUsage
from chamber.common.quota import ConfigError, non_finite, validate
from chamber.common.quotastore import StaleConfig
from chamber.gateway.core.authz import Permission
from chamber.gateway.core.requests import PoolBody, PoolPatch, TeamBody, TeamPatch
from chamber.gateway.errors import BadRequest, Conflict, FieldProblem, NotFound, Unavailable, Unprocessable
from chamber.gateway.http_edge import body
from chamber.gateway.jobs_api import gateway
from chamber.gateway.problems import responses
from chamber.gateway.state import GatewayState

READ = {"permission": Permission.READ}
WRITE = {"permission": Permission.QUOTA_WRITE}
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
"""Checked with `fullmatch`: `^...$` with `match` lets a name end in a newline ("ml\n" would reach KV keys)."""


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


def check_name(kind: str, name: str) -> None:
    if not NAME.fullmatch(name):
        raise BadRequest(f"invalid {kind} name {name!r}: 1-64 lower-case letters, digits and '-', starting with a "
                         "letter or digit", code="invalid-name",
                         errors=[FieldProblem(field="name", message="^[a-z0-9][a-z0-9-]{0,63}$")])  # fmt: skip


def check_finite(item: TeamConfig | PoolConfig) -> None:
    """A 400 naming the field for inf or nan: JSON cannot store them, so the stored configuration would hold null
    and never decode again. (The JSON decoder refuses them already; this holds for any other way in.)"""
    bad = non_finite(item)
    if bad:
        raise BadRequest("; ".join(f"{where}: {value} is not a finite number" for where, value in bad),
                         code="not-finite", errors=[FieldProblem(field=w, message="not a finite number")
                                                    for w, _ in bad])  # fmt: skip


def team_view(gw: GatewayState, config: QuotaConfig, name: str) -> TeamView | None:
    team = next((t for t in config.teams if t.name == name), None)
    usage = gw.quota_usage(name)
    if team is None and usage is None:
        return None
    return TeamView(name=name, config=team, usage=usage or TeamUsage(team=name))


async def current_config(gw: GatewayState) -> QuotaConfig:
    gw.require_bus()
    try:
        config, _ = await gw.quota_store.get()
    except BusError as exc:
        raise Unavailable(str(exc)) from exc
    return config


async def all_teams(gw: GatewayState) -> list[TeamView]:
    config = await current_config(gw)
    names = sorted({t.name for t in config.teams} | set(gw.quota_teams()))
    return [v for n in names if (v := team_view(gw, config, n)) is not None]


async def one_team(gw: GatewayState, name: str) -> TeamView:
    view = team_view(gw, await current_config(gw), name)
    if view is None:
        raise NotFound(f"no team {name!r}", code="no-such-team")
    return view


@get("/v1/teams", summary="Teams with their quota, usage, fair share and budget", opt=READ,
     responses=responses(401, 403, 503))  # fmt: skip
async def list_teams(request: Request[Any, Any, Any]) -> list[TeamView]:
    return await all_teams(gateway(request))


@get("/v1/teams/{name:str}", summary="One team", opt=READ, responses=responses(400, 401, 403, 404, 503))
async def get_team(request: Request[Any, Any, Any], name: FromPath[str]) -> TeamView:
    return await one_team(gateway(request), name)


def _team(config: QuotaConfig, name: str) -> TeamConfig:
    team = next((t for t in config.teams if t.name == name), None)
    if team is None:
        raise NotFound(f"no team {name!r} in the configuration", code="no-such-team")
    return team


def _pool(config: QuotaConfig, name: str) -> PoolConfig:
    pool = next((p for p in config.pools if p.name == name), None)
    if pool is None:
        raise NotFound(f"no pool {name!r}", code="no-such-pool")
    return pool


@put("/v1/teams/{name:str}", summary="Create or replace a team (admin; fields left out take their defaults)",
     opt=WRITE, responses=responses(400, 401, 403, 409, 413, 422, 503))  # fmt: skip
async def put_team(request: Request[Any, Any, Any], name: FromPath[str], data: JSONBody[TeamBody]) -> TeamView:
    check_name("team", name)
    team = (body(request) or data).to_config(name)
    check_finite(team)
    gw = gateway(request)
    config = await _change(gw, lambda c: _replace(c, "teams", team))
    return _view_after(gw, config, name)


@patch("/v1/teams/{name:str}", summary="Change some fields of a team (admin)", opt=WRITE,
       responses=responses(400, 401, 403, 404, 409, 413, 422, 503))  # fmt: skip
async def patch_team(request: Request[Any, Any, Any], name: FromPath[str], data: JSONBody[TeamPatch]) -> TeamView:
    check_name("team", name)
    change: TeamPatch = body(request) or data
    gw = gateway(request)
    config = await _change(gw, lambda c: _replace(c, "teams", change.apply(_team(c, name))))
    return _view_after(gw, config, name)


@delete("/v1/teams/{name:str}", status_code=HTTP_204_NO_CONTENT, summary="Delete a team (admin)", opt=WRITE,
        responses=responses(400, 401, 403, 404, 409, 422, 503))  # fmt: skip
async def delete_team(request: Request[Any, Any, Any], name: FromPath[str]) -> None:
    check_name("team", name)

    def remove(c: QuotaConfig) -> QuotaConfig:
        _team(c, name)
        return msgspec.structs.replace(c, teams=[t for t in c.teams if t.name != name])

    await _change(gateway(request), remove)


def _view_after(gw: GatewayState, config: QuotaConfig, name: str) -> TeamView:
    view = team_view(gw, config, name)
    if view is None:  # pragma: no cover - the team is in `config`
        raise NotFound(f"no team {name!r}")
    return view


@get("/v1/pools", summary="Capacity pools", opt=READ, responses=responses(401, 403, 503))
async def list_pools(request: Request[Any, Any, Any]) -> list[PoolView]:
    gw = gateway(request)
    config = await current_config(gw)
    return [_pool_view(gw, config, p) for p in config.pools]


@get("/v1/pools/{name:str}", summary="One capacity pool", opt=READ, responses=responses(400, 401, 403, 404, 503))
async def get_pool(request: Request[Any, Any, Any], name: FromPath[str]) -> PoolView:
    gw = gateway(request)
    config = await current_config(gw)
    return _pool_view(gw, config, _pool(config, name))


@put("/v1/pools/{name:str}", summary="Create or replace a capacity pool (admin)", opt=WRITE,
     responses=responses(400, 401, 403, 409, 413, 422, 503))  # fmt: skip
async def put_pool(request: Request[Any, Any, Any], name: FromPath[str], data: JSONBody[PoolBody]) -> PoolView:
    check_name("pool", name)
    pool = (body(request) or data).to_config(name)
    check_finite(pool)
    gw = gateway(request)
    config = await _change(gw, lambda c: _replace(c, "pools", pool))
    return _pool_view(gw, config, pool)


@patch("/v1/pools/{name:str}", summary="Change some fields of a capacity pool (admin)", opt=WRITE,
       responses=responses(400, 401, 403, 404, 409, 413, 422, 503))  # fmt: skip
async def patch_pool(request: Request[Any, Any, Any], name: FromPath[str], data: JSONBody[PoolPatch]) -> PoolView:
    check_name("pool", name)
    change: PoolPatch = body(request) or data
    gw = gateway(request)
    config = await _change(gw, lambda c: _replace(c, "pools", change.apply(_pool(c, name))))
    return _pool_view(gw, config, _pool(config, name))


@delete("/v1/pools/{name:str}", status_code=HTTP_204_NO_CONTENT, summary="Delete a pool no team uses (admin)",
        opt=WRITE, responses=responses(400, 401, 403, 404, 409, 422, 503))  # fmt: skip
async def delete_pool(request: Request[Any, Any, Any], name: FromPath[str]) -> None:
    check_name("pool", name)

    def remove(c: QuotaConfig) -> QuotaConfig:
        _pool(c, name)
        users = sorted(t.name for t in c.teams if any(q.pool == name for q in t.quotas))
        if users:
            raise Conflict(f"pool {name!r} is in the quotas of {', '.join(users)}; change those first",
                           code="pool-in-use")  # fmt: skip
        return msgspec.structs.replace(c, pools=[p for p in c.pools if p.name != name])

    await _change(gateway(request), remove)


def _pool_view(gw: GatewayState, config: QuotaConfig, pool: PoolConfig) -> PoolView:
    capacity = gw.pool_capacity().get(pool.name, pool.capacity or 0)
    nominal = sum(q.nominal for t in config.teams for q in t.quotas if q.pool == pool.name)
    return PoolView(name=pool.name, config=pool, capacity=capacity, nominal_total=nominal)


def _replace(config: QuotaConfig, field: Literal["teams", "pools"], item: TeamConfig | PoolConfig) -> QuotaConfig:
    items = [x for x in getattr(config, field) if x.name != item.name]
    return msgspec.structs.replace(config, **{field: [*items, item]})


async def _change(gw: GatewayState, edit: Callable[[QuotaConfig], QuotaConfig]) -> QuotaConfig:
    """Apply `edit` to the stored configuration: validate, then compare-and-set (retried once if raced)."""
    gw.require_bus()
    for _ in range(2):
        try:
            current, revision = await gw.quota_store.get()
        except BusError as exc:
            raise Unavailable(str(exc)) from exc
        try:
            changed = edit(current)
        except msgspec.ValidationError as exc:
            raise Unprocessable(f"invalid quota configuration: {exc}", code="invalid-configuration") from exc
        try:
            validate(changed, gw.pool_capacity())
        except ConfigError as exc:
            raise Unprocessable(f"invalid quota configuration: {exc}", code="invalid-configuration") from exc
        try:
            await gw.quota_store.put(changed, revision)
        except StaleConfig:
            continue
        except BusError as exc:
            raise Unavailable(str(exc)) from exc
        gw.quota_config = changed
        return changed
    raise Conflict("the quota configuration changed meanwhile; try again", code="changed-meanwhile")


@get("/v1/orgs", summary="Organisations with the sums of the teams below them", opt=READ,
     responses=responses(401, 403, 503))  # fmt: skip
async def list_orgs(request: Request[Any, Any, Any]) -> list[OrgUsage]:
    quota = gateway(request).quota_state
    return [] if quota is None else list(quota.orgs.values())


ROUTES = [list_teams, get_team, put_team, patch_team, delete_team, list_pools, get_pool, put_pool, patch_pool,
          delete_pool, list_orgs]  # fmt: skip
