"""A job's output over HTTP: `GET /v1/jobs/{id}/logs`, once or followed as it is written.

The output lives on the node that ran the replica; its agent serves it by request/reply (`agent.<node>.logs`).
The gateway finds the node from the job's placement (the current attempt) or from the scheduler's placement
decision of that attempt (an earlier one), and passes byte offsets through, so a client resumes where it stopped
(`X-Chamber-Next-Offset`). Output is bounded per replica and attempt: older bytes are rotated away, and a read
from before them starts at the oldest byte kept (`X-Chamber-Offset` says where).
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

import nats.errors
from litestar import Request, get
from litestar.params import FromPath, QueryParameter
from litestar.response import Response, Stream

from chamber.common.codec import DecodeError, Decoder, encode
from chamber.common.contracts import GpuRef, JobPlaced, JobRecord, LogsChunk, LogsRequest
from chamber.common.contracts.agent import LOG_CHUNK_MAX
from chamber.common.kube import labels as L
from chamber.common.subjects import DECISIONS
from chamber.gateway import jobs
from chamber.gateway.core.authz import Permission
from chamber.gateway.errors import BadRequest, NotFound, Unavailable
from chamber.gateway.http_edge import bearer, principal
from chamber.gateway.problems import responses
from chamber.gateway.state import GatewayState

FOLLOW_POLL_S = 0.5
REQUEST_TIMEOUT_S = 3.0
TEXT = "text/plain; charset=utf-8"


def _elsewhere(executor: str, record: JobRecord) -> str | None:
    """Where the job's output is when no node agent ran it (only the agents keep output here); None: an agent did."""
    if executor == "simulated":
        return (
            "the simulated executor runs no process, so there is none (CHAMBER_EXECUTOR=process runs real ones "
            "through node agents, which keep their output)"
        )
    if executor == "kubernetes":
        ref = record.spec.workload
        namespace = f"-n {ref.namespace} " if ref is not None else ""
        return (
            "the Kubernetes executor runs it in pods, whose output Kubernetes keeps: "
            f"kubectl logs {namespace}-l {L.JOB_ID}={record.id} --prefix --tail=-1"
        )
    return None


def _gw(request: Request[Any, Any, Any]) -> GatewayState:
    gw: GatewayState = request.app.state.gateway
    return gw


async def _record(gw: GatewayState, job_id: str) -> JobRecord:
    assert gw.store is not None
    stored = await gw.store.get(job_id)
    if stored is None:
        raise NotFound(f"no job {job_id!r}", code="no-such-job")
    return stored[0]


async def _placement(gw: GatewayState, record: JobRecord, attempt: int) -> list[GpuRef]:
    if record.placement is not None and record.placement.attempt == attempt:
        return record.placement.gpus
    subject = gw.bus.names.decision_placed(record.id)
    placed: list[JobPlaced] = await gw.bus.read_since(DECISIONS, subject, record.submitted_at - 1, Decoder(JobPlaced))
    for decision in placed:
        if decision.attempt == attempt:
            return decision.gpus
    raise NotFound(f"job {record.id} has no attempt {attempt}", code="no-such-attempt")


async def _fetch(gw: GatewayState, node: str, request: LogsRequest) -> LogsChunk:
    subject = gw.bus.names.agent_request(node, "logs")
    try:
        msg = await gw.bus.nc.request(subject, encode(request), timeout=REQUEST_TIMEOUT_S)
        chunk: LogsChunk = Decoder(LogsChunk).decode(msg.data)
    except (nats.errors.Error, TimeoutError, DecodeError) as exc:
        raise Unavailable(
            f"no node agent answers for {node} ({type(exc).__name__}); a job's output is kept by the agent of the "
            "node it ran on (CHAMBER_EXECUTOR=process)"
        ) from exc
    return chunk


def _headers(chunk: LogsChunk) -> dict[str, str]:
    return {
        "X-Chamber-Node": chunk.node,
        "X-Chamber-Attempt": str(chunk.attempt),
        "X-Chamber-Offset": str(chunk.offset),
        "X-Chamber-Next-Offset": str(chunk.next_offset),
        "X-Chamber-Running": "true" if chunk.running else "false",
    }


@get(
    "/v1/jobs/{job_id:str}/logs",
    summary="A replica's output (stdout and stderr together); `follow=true` streams it as it is written",
    opt={"permission": Permission.JOBS_READ}, responses=responses(400, 401, 403, 404, 503),
)  # fmt: skip
async def job_logs(
    request: Request[Any, Any, Any],
    job_id: FromPath[str],
    *,
    replica: Annotated[int, QueryParameter(name="replica", ge=0)] = 0,
    attempt: Annotated[int | None, QueryParameter(name="attempt", ge=1)] = None,
    offset: Annotated[int, QueryParameter(name="offset", ge=0)] = 0,
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=LOG_CHUNK_MAX)] = LOG_CHUNK_MAX,
    follow: Annotated[bool, QueryParameter(name="follow")] = False,
) -> Response[bytes] | Stream:
    gw = _gw(request)
    await jobs.get(gw, principal(request), job_id)  # 404 or 403 (another team's job) as for the job itself
    record = await _record(gw, job_id)
    if replica >= record.spec.replicas:
        raise BadRequest(f"replica: job {job_id} has replicas 0 to {record.spec.replicas - 1}", code="no-such-replica")
    attempt = attempt or record.attempt
    if attempt == 0:
        raise NotFound(f"job {job_id} has not been placed yet: no output", code="no-output")
    elsewhere = _elsewhere(gw.settings.executor, record)
    if elsewhere:
        raise NotFound(f"no output kept by Chamber for job {job_id}: {elsewhere}", code="no-output")
    gpus = await _placement(gw, record, attempt)
    node = gpus[replica * record.spec.gpus_per_replica].node
    asked = LogsRequest(job_id=job_id, attempt=attempt, replica=replica, offset=offset, limit=limit)
    first = await _fetch(gw, node, asked)
    if not first.found:
        raise NotFound(f"no output kept for job {job_id}, attempt {attempt}, replica {replica} on {node}",
                       code="no-output")  # fmt: skip
    if not follow:
        return Response(first.data, media_type=TEXT, headers=_headers(first))

    who = principal(request)
    token = bearer(request.scope) or ""

    async def stream() -> AsyncIterator[bytes]:
        chunk = first
        while True:
            if gw.tokens.authenticate(token) != who:  # revoked (or changed) since the stream began: end it
                return
            if chunk.data:
                yield chunk.data
            elif not chunk.running:
                return
            else:
                await asyncio.sleep(FOLLOW_POLL_S)
                if gw.tokens.authenticate(token) != who:
                    return
            request_next = LogsRequest(job_id=job_id, attempt=attempt, replica=replica, offset=chunk.next_offset)
            try:
                chunk = await _fetch(gw, node, request_next)
            except Unavailable:
                return

    return Stream(stream(), media_type=TEXT, headers=_headers(first))


ROUTES = [job_logs]
