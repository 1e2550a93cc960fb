"""Every error the HTTP API gives is `application/problem+json` (RFC 9457): a title, the status, a detail that says
what to change, and for invalid input the fields at fault. Infrastructure failures (NATS, Redis) become a fast
503 with `Retry-After`; nothing a client sends can make the gateway answer 500.
"""

from typing import Any, cast

import msgspec
import nats.errors
import redis.exceptions
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi.datastructures import ResponseSpec
from litestar.types import ExceptionHandlersMap

from chamber.common.bus.errors import BusError
from chamber.common.ledger.errors import LedgerUnavailable
from chamber.common.log import get_logger
from chamber.gateway.errors import ApiError, FieldProblem, Unavailable

log = get_logger(__name__)

PROBLEM_JSON = "application/problem+json"
DETAIL_KEY = "chamber.detail"
"""Scope key where the outcome's detail is left for the audit record."""


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An error (RFC 9457). `code` names the problem for programs; `errors` lists the fields at fault."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str = ""
    code: str = ""
    errors: list[FieldProblem] = msgspec.field(default_factory=list)


_PHRASES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}  # fmt: skip

DESCRIPTIONS = {
    400: "Malformed request: bad JSON, a wrong type, an unknown field or a value out of range (the fields at fault "
    "are listed in `errors`)",
    401: "No token, or an unknown or revoked one: send `Authorization: Bearer <token>`",
    403: "The token's role (or, for members, its teams) does not allow this",
    404: "No such job, node, GPU, team, pool or token",
    409: "Conflicts with the current state (the job already finished; the configuration changed meanwhile; an "
    "idempotency key reused for a different request)",
    413: "The request body is larger than the gateway accepts",
    422: "Well-formed but impossible: a job that can never run on this fleet, a quota beyond capacity",
    503: "NATS or Redis is unreachable; retry after `Retry-After` seconds",
}


def note(request: Request[Any, Any, Any], detail: str) -> None:
    """Leave the outcome's detail (what was made, why it was refused) for the audit record."""
    cast(dict[str, Any], request.scope)[DETAIL_KEY] = detail


def raw_json(data: bytes, *, status: int = 200, headers: dict[str, str] | None = None) -> Response[Any]:
    """An answer whose JSON is already encoded (cached bytes); the route's annotation documents its shape."""
    return Response(content=data, status_code=status, media_type="application/json", headers=headers or {})


def problem_response(
    request: Request[Any, Any, Any] | None,
    status: int,
    detail: str,
    *,
    code: str = "",
    errors: list[FieldProblem] | None = None,
    headers: dict[str, str] | None = None,
) -> Response[bytes]:
    body = Problem(title=_PHRASES.get(status, "Error"), status=status, detail=detail, code=code,
                   instance=request.url.path if request is not None else "", errors=errors or [])  # fmt: skip
    if request is not None:
        note(request, detail)
    return Response(content=msgspec.json.encode(body), status_code=status, media_type=PROBLEM_JSON,
                    headers=headers or {})  # fmt: skip


def on_api_error(request: Request[Any, Any, Any], exc: ApiError) -> Response[bytes]:
    return problem_response(request, exc.status, exc.detail, code=exc.code, errors=exc.errors, headers=exc.headers)


def on_validation_error(request: Request[Any, Any, Any], exc: ValidationException) -> Response[bytes]:
    """A parameter Litestar refused: each problem names the parameter as the client sent it (`state`, not the
    handler's `job_state`; found by review: the field read `ParamType.QUERY job_state`)."""
    errors, wheres = [], []
    for item in exc.extra if isinstance(exc.extra, list) else []:
        if isinstance(item, dict):
            source = item.get("source")
            kind = str(getattr(source, "value", source or ""))
            name = _sent_as(request, str(item.get("key", "")), kind)
            errors.append(FieldProblem(field=name, message=str(item.get("message", ""))))
            wheres.append(f"{kind} parameter {name}".strip())
    detail = "; ".join(f"{w}: {e.message}" for w, e in zip(wheres, errors, strict=True)) or str(exc.detail)
    return problem_response(request, 400, detail, code="invalid", errors=errors)


def _sent_as(request: Request[Any, Any, Any], key: str, kind: str) -> str:
    """The name a handler's parameter `key` has in the request (its query, header or cookie alias)."""
    try:
        definition = request.route_handler.parsed_fn_signature.parameters[key].kwarg_definition
    except (KeyError, AttributeError):
        return key
    for alias in (getattr(definition, kind, None) if kind in ("query", "header", "cookie") else None,
                  getattr(definition, "name", None)):  # fmt: skip
        if isinstance(alias, str) and alias:
            return alias
    return key


def on_http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if status >= 500:
        log.error("http.error", path=request.url.path, status=status, detail=exc.detail)
    return problem_response(
        request, status, str(exc.detail), code=_HTTP_CODES.get(status, ""), headers=dict(exc.headers or {})
    )


_HTTP_CODES = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large", 415: "unsupported-media-type"}
"""A `code` for the errors Litestar raises itself (a body over the limit was a 413 with an empty code)."""


def on_unavailable(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    log.warning("http.dependency_unavailable", path=request.url.path, error=str(exc))
    return on_api_error(request, Unavailable(f"a dependency is unreachable: {exc}"))


def on_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    """A bug (the fuzz suite asserts there is none): logged with its traceback, answered 500 without details."""
    log.exception("http.unexpected", path=request.url.path, error=repr(exc))
    return problem_response(request, 500, "internal error; it was logged", code="internal")


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ApiError: on_api_error,
    ValidationException: on_validation_error,
    HTTPException: on_http_error,
    BusError: on_unavailable,
    LedgerUnavailable: on_unavailable,
    redis.exceptions.RedisError: on_unavailable,
    nats.errors.Error: on_unavailable,
    TimeoutError: on_unavailable,
    Exception: on_unexpected,
}


def responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the errors a route can answer."""
    return {
        status: ResponseSpec(
            data_container=Problem, description=DESCRIPTIONS[status], media_type=PROBLEM_JSON, generate_examples=False
        )
        for status in statuses
    }
