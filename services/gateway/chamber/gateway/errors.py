"""The gateway's errors: one class per answer a client can get, shared by HTTP (problem+json, RFC 9457) and gRPC
(a status code), so both front doors refuse the same things the same way."""

from typing import ClassVar

import msgspec


class FieldProblem(msgspec.Struct, kw_only=True):
    field: str
    """Where in the request: `$.gpus_per_replica`, a query parameter's name, a header."""
    message: str


class ApiError(Exception):
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"
    grpc_code: ClassVar[str] = "INTERNAL"

    def __init__(
        self,
        detail: str,
        *,
        code: str = "",
        errors: list[FieldProblem] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.code = code
        self.errors = errors or []
        self.headers = headers or {}


class BadRequest(ApiError):
    status, title, grpc_code = 400, "Bad Request", "INVALID_ARGUMENT"


class Unauthenticated(ApiError):
    status, title, grpc_code = 401, "Unauthorized", "UNAUTHENTICATED"

    def __init__(self, detail: str, **kw: object) -> None:
        super().__init__(detail, code="unauthenticated", headers={"WWW-Authenticate": 'Bearer realm="chamber"'})


class Forbidden(ApiError):
    status, title, grpc_code = 403, "Forbidden", "PERMISSION_DENIED"


class NotFound(ApiError):
    status, title, grpc_code = 404, "Not Found", "NOT_FOUND"


class Conflict(ApiError):
    status, title, grpc_code = 409, "Conflict", "FAILED_PRECONDITION"


class PayloadTooLarge(ApiError):
    status, title, grpc_code = 413, "Content Too Large", "RESOURCE_EXHAUSTED"


class Unprocessable(ApiError):
    """Well-formed, but it can never be done (a job that can never run, a quota above capacity)."""

    status, title, grpc_code = 422, "Unprocessable Content", "FAILED_PRECONDITION"


class Unavailable(ApiError):
    """A dependency (NATS, Redis) is down: try again shortly."""

    status, title, grpc_code = 503, "Service Unavailable", "UNAVAILABLE"
    RETRY_AFTER_S = 2

    def __init__(self, detail: str, **kw: object) -> None:
        super().__init__(detail, code="unavailable", headers={"Retry-After": str(self.RETRY_AFTER_S)})


ERRORS: tuple[type[ApiError], ...] = (
    BadRequest, Unauthenticated, Forbidden, NotFound, Conflict, PayloadTooLarge, Unprocessable, Unavailable,
)  # fmt: skip
