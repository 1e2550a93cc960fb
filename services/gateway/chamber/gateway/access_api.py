"""Who may call the API: the caller's own identity, tokens (admins mint and revoke them), and the audit trail."""

from typing import Annotated, Any

import msgspec
from litestar import Request, delete, get, post
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_204_NO_CONTENT

from chamber.common.bus.errors import BusError
from chamber.common.contracts import AuditRecord
from chamber.gateway.core.authz import Permission, Principal, Role
from chamber.gateway.core.requests import TokenRequest
from chamber.gateway.errors import BadRequest, Conflict, FieldProblem, NotFound, Unavailable
from chamber.gateway.http_edge import body, principal
from chamber.gateway.jobs_api import gateway
from chamber.gateway.problems import note, responses
from chamber.gateway.tokens import LastAdmin, TokenRecord


class TokenView(msgspec.Struct, kw_only=True):
    id: str
    name: str
    role: Role
    teams: list[str]
    created_at: float
    created_by: str
    expires_at: float | None = None
    """When it stops being accepted (none: when it is revoked)."""


class NewToken(TokenView, kw_only=True):
    token: str
    """The token itself: shown once, now. Send it as `Authorization: Bearer <token>`."""


def token_view(r: TokenRecord) -> TokenView:
    return TokenView(id=r.id, name=r.name, role=r.role, teams=list(r.teams), created_at=r.created_at,
                     created_by=r.created_by, expires_at=r.expires_at)  # fmt: skip


@get("/v1/me", summary="Who the token belongs to: its role and teams", opt={"permission": Permission.READ},
     responses=responses(401, 403))  # fmt: skip
async def whoami(request: Request[Any, Any, Any]) -> Principal:
    return principal(request)


@get("/v1/tokens", summary="API tokens (admin; never the secrets)", opt={"permission": Permission.TOKENS_MANAGE},
     responses=responses(401, 403))  # fmt: skip
async def list_tokens(request: Request[Any, Any, Any]) -> list[TokenView]:
    return [token_view(r) for r in gateway(request).tokens.list()]


@post("/v1/tokens", status_code=HTTP_201_CREATED, summary="Mint a token (admin); the answer shows it once",
      opt={"permission": Permission.TOKENS_MANAGE}, responses=responses(400, 401, 403, 413, 503))  # fmt: skip
async def create_token(request: Request[Any, Any, Any], data: JSONBody[TokenRequest]) -> NewToken:
    gw = gateway(request)
    req: TokenRequest = body(request) or data
    if req.role == Role.MEMBER and not req.teams:
        raise BadRequest("a member token needs at least one team", code="invalid",
                         errors=[FieldProblem(field="$.teams", message="at least one team")])  # fmt: skip
    if req.role != Role.MEMBER and req.teams:
        raise BadRequest(f"only members have teams (role {req.role.value} sees every team)", code="invalid",
                         errors=[FieldProblem(field="$.teams", message="only for role member")])  # fmt: skip
    gw.require_bus()
    who = principal(request)
    try:
        now = gw.clock.now()
        expires_at = None if req.expires_in_s is None else now + req.expires_in_s
        record, token = await gw.tokens.create(name=req.name, role=req.role, teams=tuple(sorted(set(req.teams))),
                                               created_by=who.id, now=now, expires_at=expires_at)  # fmt: skip
    except BusError as exc:
        raise Unavailable(str(exc)) from exc
    note(request, f"token {record.id} ({record.role.value})")
    return NewToken(**msgspec.structs.asdict(token_view(record)), token=token)


@delete("/v1/tokens/{token_id:str}", status_code=HTTP_204_NO_CONTENT, summary="Revoke a token (admin)",
        opt={"permission": Permission.TOKENS_MANAGE}, responses=responses(400, 401, 403, 404, 409, 503))  # fmt: skip
async def revoke_token(request: Request[Any, Any, Any], token_id: FromPath[str]) -> None:
    gw = gateway(request)
    if gw.tokens.get(token_id) is None:
        raise NotFound(f"no token {token_id!r}", code="no-such-token")
    gw.require_bus()
    try:
        await gw.tokens.revoke(token_id)
    except LastAdmin as exc:
        raise Conflict(str(exc), code="last-admin") from exc
    except BusError as exc:
        raise Unavailable(str(exc)) from exc


@get("/v1/audit", summary="The audit trail: every mutating call, newest first (admins, operators)",
     opt={"permission": Permission.AUDIT_READ}, responses=responses(400, 401, 403, 503))  # fmt: skip
async def read_audit(
    request: Request[Any, Any, Any],
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=1000)] = 100,
    actor: Annotated[str | None, QueryParameter(name="actor", max_length=64)] = None,
    outcome: Annotated[
        str | None, QueryParameter(name="outcome", pattern=r"^(ok|denied|rejected|error)$(?!\n)")
    ] = None,
    since: Annotated[float | None, QueryParameter(name="since", ge=0, le=1e11)] = None,
) -> list[AuditRecord]:
    gw = gateway(request)
    gw.require_bus()
    try:
        return await gw.audit.read(limit=limit, actor=actor, since=since, outcome=outcome)
    except BusError as exc:
        raise Unavailable(str(exc)) from exc


ROUTES = [whoami, list_tokens, create_token, revoke_token, read_audit]
