"""What every HTTP request passes through before and after its route: who is calling (a Bearer token, checked
in memory), whether the route allows it (the route's permission against the role), a strictly typed body, one
access-log line, and for every mutating call an audit record written before the answer's last byte leaves.

Bodies are decoded here with msgspec in strict mode (Litestar's own parsing coerces `"4"` to `4`); a body that is
not valid JSON, has a wrong type, an unknown field or is nested too deeply gets a 400 naming the field.
"""

import itertools
import re
import secrets
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec
from litestar import Request
from litestar.enums import ScopeType
from litestar.handlers import BaseRouteHandler
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from chamber.common.contracts import AuditRecord
from chamber.gateway.audit import resource_of
from chamber.gateway.core.authz import Permission, Principal, denial
from chamber.gateway.errors import BadRequest, FieldProblem, Forbidden, Unauthenticated
from chamber.gateway.problems import DETAIL_KEY, PROBLEM_JSON, Problem
from chamber.gateway.state import GatewayState

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BODY_KEY = "chamber.body"
_FIELD = re.compile(r"at `(\$[^`]*)`")
_TYPED = re.compile(r":\w+}")


_PREFIX = secrets.token_hex(4)
_COUNTER = itertools.count(1)


def next_request_id() -> str:
    """Unique per request without a system call: this process's random prefix and a counter."""
    return f"{_PREFIX}{next(_COUNTER):x}"


def is_protected(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def bearer(scope: Scope) -> str | None:
    """The request's Bearer token (None: none given); long-lived streams check it again as they go."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _outcome(status: int) -> str:
    if status < 400:
        return "ok"
    if status in (401, 403):
        return "denied"
    return "rejected" if status < 500 else "error"


def edge_middleware(gw: GatewayState) -> Callable[[ASGIApp], ASGIApp]:
    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            started = time.perf_counter()
            path: str = scope["path"]
            method: str = scope["method"]
            token = bearer(scope)
            principal = gw.tokens.authenticate(token) if token is not None and gw._tokens is not None else None
            scope["user"] = principal
            request_id = next_request_id()
            protected = is_protected(path)
            audited = protected and method in MUTATING
            status = 0

            async def finish() -> None:
                if audited:
                    route = scope.get("route_handler")
                    template = _TYPED.sub("}", next(iter(route.paths))) if route is not None else path
                    who = principal
                    record = AuditRecord(
                        at=gw.clock.now(), actor=who.id if who else "anonymous", actor_name=who.name if who else "",
                        role=who.role.value if who else "", action=f"{method} {template}", target=path,
                        status=status, outcome=_outcome(status), detail=str(scope.get(DETAIL_KEY, ""))[:500],
                        request_id=request_id,
                    )  # fmt: skip
                    await gw.audit.record(record, resource_of(path))

            async def send_wrapper(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                elif message["type"] == "http.response.body" and not message.get("more_body", False):
                    await finish()
                await send(message)

            if protected and principal is None:
                if token is None:
                    why = "no token: send 'Authorization: Bearer <token>'"
                else:
                    why = gw.tokens.refusal(token) if gw._tokens is not None else "unknown or revoked token"
                cast(dict[str, Any], scope)[DETAIL_KEY] = why
                await _send_problem(send_wrapper, 401, why, path, {"www-authenticate": 'Bearer realm="chamber"'})
            else:
                await app(scope, receive, send_wrapper)
            if gw.settings.access_log:
                gw.access_log.line(method=method, path=path, status=status,
                                   ms=round((time.perf_counter() - started) * 1000, 2),
                                   who=principal.id if principal else "-", request_id=request_id)  # fmt: skip

        return middleware

    return factory


async def _send_problem(send: Send, status: int, detail: str, path: str, headers: dict[str, str]) -> None:
    body = msgspec.json.encode(Problem(title="Unauthorized", status=status, detail=detail, instance=path,
                                       code="unauthenticated"))  # fmt: skip
    raw_headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def authorize(scope: Scope, handler: BaseRouteHandler) -> None:
    """The route's `permission` (its `opt`) against the caller's role. Checked first thing in `admit` rather than
    as a Litestar guard: a guard is handed a copy of the route handler, made for every request (`chamber bench
    gateway`: 13% of a cached read's CPU, 4% of a submit's)."""
    permission: Permission | None = handler.opt.get("permission")
    if permission is None:
        return
    who: Principal | None = scope.get("user")
    if who is None:
        raise Unauthenticated("no token: send 'Authorization: Bearer <token>'")
    why = denial(who, permission)
    if why is not None:
        raise Forbidden(why, code="forbidden")


def principal(request: Request[Any, Any, Any]) -> Principal:
    who: Principal | None = request.scope.get("user")
    if who is None:
        raise Unauthenticated("no token: send 'Authorization: Bearer <token>'")
    return who


_decoders: dict[Any, tuple[msgspec.json.Decoder[Any], bool] | None] = {}


def _decoder_for(handler: Any) -> tuple[msgspec.json.Decoder[Any], bool] | None:
    key = handler.fn  # the route's function: the same for every app built from it
    if key not in _decoders:
        param = handler.parsed_fn_signature.parameters.get("data")
        if param is None:
            _decoders[key] = None
        else:
            optional = param.is_optional
            target = param.annotation
            _decoders[key] = (msgspec.json.Decoder(target), optional)
    return _decoders[key]


def _choices(target: Any, path: str) -> list[str]:
    """The allowed values of the enum or literal at `path` (`$.a.b[0].c`) of `target`; empty if not one."""
    info: Any = msgspec.inspect.type_info(target)
    for part in re.findall(r"\.(\w+)|\[\d+\]", path):
        while isinstance(info, msgspec.inspect.UnionType):
            info = next((t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)), info.types[0])
        if part and isinstance(info, msgspec.inspect.StructType):
            info = next((f.type for f in info.fields if f.encode_name == part), None)
        elif not part and isinstance(info, msgspec.inspect.ListType | msgspec.inspect.TupleType):
            info = getattr(info, "item_type", None)
        if info is None:
            return []
    while isinstance(info, msgspec.inspect.UnionType):
        info = next((t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)), info.types[0])
    if isinstance(info, msgspec.inspect.LiteralType):
        return [str(v) for v in info.values]
    if isinstance(info, msgspec.inspect.EnumType):
        return [str(m.value) for m in info.cls]
    return []


def decode_strict(raw: bytes, decoder: msgspec.json.Decoder[Any]) -> Any:
    """Decode a JSON body strictly; any failure is a 400 that names the field (and, for enums, the choices)."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        found = _FIELD.search(str(exc))
        where = found.group(1) if found else "$"
        message = str(exc).split(" - at ")[0]
        choices = _choices(decoder.type, where) if message.startswith("Invalid enum value") else []
        if choices:
            message += f"; use one of {', '.join(choices)}"
        raise BadRequest(f"invalid body at {where}: {message}", code="invalid",
                         errors=[FieldProblem(field=where, message=message)]) from exc  # fmt: skip
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", code="malformed-json") from exc
    except (RecursionError, UnicodeDecodeError, OverflowError, ValueError) as exc:
        raise BadRequest("the body is not acceptable JSON (nested too deeply or badly encoded)",
                         code="malformed-json") from exc  # fmt: skip


async def admit(request: Request[Any, Any, Any]) -> None:
    """before_request, for every route: the caller's permission (`authorize`), then the body (`strict_body`)."""
    authorize(request.scope, request.route_handler)
    await strict_body(request)


async def strict_body(request: Request[Any, Any, Any]) -> None:
    """Decode the route's `data` strictly (the route then gets the same value)."""
    found = _decoder_for(request.route_handler)
    if found is None:
        return
    decoder, optional = found
    raw = await request.body()
    if not raw.strip():
        if optional:
            cast(dict[str, Any], request.scope)[BODY_KEY] = None
            return
        raise BadRequest("a JSON body is required", code="missing-body")
    cast(dict[str, Any], request.scope)[BODY_KEY] = decode_strict(raw, decoder)


def body(request: Request[Any, Any, Any]) -> Any:
    """The strictly decoded body (set by `strict_body`)."""
    return request.scope.get(BODY_KEY)
