"""The audit trail: one record per mutating API call (HTTP or gRPC), accepted or refused.

Kept on the AUDIT stream so that who cordoned a node, cancelled a job or minted a token can be answered later,
from any gateway replica.
"""

from chamber.common.contracts.base import Event


class AuditRecord(Event, frozen=True):
    at: float
    actor: str
    """The token's id (`anonymous` when no valid token was presented)."""
    action: str
    """`<METHOD> <route>`, e.g. `POST /v1/jobs` or `DELETE /v1/jobs/{job_id}`; gRPC: `grpc <Service>/<Method>`."""
    status: int
    """The HTTP status (gRPC calls: the equivalent HTTP status)."""
    outcome: str
    """`ok`, `denied` (401/403), `rejected` (other 4xx) or `error` (5xx)."""
    actor_name: str = ""
    role: str = ""
    target: str = ""
    """What it acted on: the path for HTTP (names the job, node, team or token), the request for gRPC."""
    detail: str = ""
    """What was made (a job or token id) or why it was refused."""
    via: str = "http"
    request_id: str = ""
