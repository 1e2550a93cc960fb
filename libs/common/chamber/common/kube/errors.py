"""The Kubernetes adapter's own errors: callers never see the client library's exceptions.

The official client raises `ApiException` (any HTTP status, or status 0 for a transport failure) and urllib3
errors; the adapter maps them onto one hierarchy by meaning, so the executor, the intake and the health shell
decide by class (retry later, the object is gone, the watch expired, a budget forbids it), and the client library
could be replaced without touching them.
"""

import json
from typing import Any


class KubeError(Exception):
    """Anything the Kubernetes API refused or could not do."""

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class KubeUnavailable(KubeError):
    """The API server could not be reached or answered 5xx: retry later."""


class KubeNotFound(KubeError):
    """404: the object (or its resource type) does not exist."""


class KubeConflict(KubeError):
    """409: the object exists already, changed since it was read, or (binding) is already assigned."""


class KubeGone(KubeError):
    """410: the resource version a watch resumes from is too old; list again."""


class KubeForbidden(KubeError):
    """401 / 403: the service account may not do this (see the chart's RBAC)."""


class KubeInvalid(KubeError):
    """400 / 422: the request was malformed or the object invalid (an admission webhook denied it)."""


class KubeTooManyRequests(KubeError):
    """429: throttled, or (eviction) a PodDisruptionBudget forbids it now; retry later."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: KubeInvalid,
    401: KubeForbidden,
    403: KubeForbidden,
    404: KubeNotFound,
    409: KubeConflict,
    410: KubeGone,
    422: KubeInvalid,
    429: KubeTooManyRequests,
}


def from_status(status: int, body: bytes | str | None, fallback: str = "") -> KubeError:
    """The error for an HTTP status and its `Status` body (its `message` is what kubectl would print)."""
    message, reason = fallback or f"HTTP {status}", ""
    if body:
        try:
            doc: Any = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            message = str(doc.get("message") or message)
            reason = str(doc.get("reason") or "")
    cls = _BY_STATUS.get(status, KubeUnavailable if status == 0 or status >= 500 else KubeError)
    return cls(message, status=status, reason=reason)
