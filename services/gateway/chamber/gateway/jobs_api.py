"""Jobs over HTTP: submit, read, list, cancel, and a job's timeline."""

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.params import FromPath, HeaderParameter, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED, HTTP_202_ACCEPTED

from chamber.common.contracts import JobState
from chamber.gateway import jobs
from chamber.gateway.core.authz import Permission
from chamber.gateway.core.requests import SubmitJobRequest
from chamber.gateway.core.views import JobView
from chamber.gateway.http_edge import body, principal
from chamber.gateway.jobs import JobTimeline
from chamber.gateway.problems import note, raw_json, responses
from chamber.gateway.state import GatewayState

JSON = "application/json"
IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        description="A retry with the same key (and the same body) returns the same job instead of a second one",
    ),
]


def gateway(request: Request[Any, Any, Any]) -> GatewayState:
    gw: GatewayState = request.app.state.gateway
    return gw


@post(
    "/v1/jobs", status_code=HTTP_201_CREATED, summary="Submit a job", opt={"permission": Permission.JOBS_WRITE},
    responses=responses(400, 401, 403, 409, 413, 422, 503),
)  # fmt: skip
async def submit_job(
    request: Request[Any, Any, Any],
    data: JSONBody[SubmitJobRequest],
    idempotency_key: IdempotencyKey = None,
) -> Response[JobView]:
    """Accepted jobs are stored durably before the answer. A job that can never run on this fleet (unknown pool,
    unknown GPU model, a gang larger than every pool that could hold it, a team without quota where quotas are
    configured) gets a 422 saying why. Members submit for their own teams only."""
    gw = gateway(request)
    view, replayed = await jobs.submit(gw, principal(request), body(request), idempotency_key)
    note(request, f"job {view.id}" + (" (replayed)" if replayed else ""))
    headers = {"Location": f"/v1/jobs/{view.id}"} | ({"Idempotent-Replayed": "true"} if replayed else {})
    return raw_json(msgspec.json.encode(view), status=HTTP_201_CREATED, headers=headers)


@get(
    "/v1/jobs/{job_id:str}", summary="One job, with the reason for its state",
    opt={"permission": Permission.JOBS_READ}, responses=responses(400, 401, 403, 404, 503),
)  # fmt: skip
async def get_job(request: Request[Any, Any, Any], job_id: FromPath[str]) -> JobView:
    return await jobs.get(gateway(request), principal(request), job_id)


@get(
    "/v1/jobs/{job_id:str}/events", summary="A job's timeline: submitted, placed (where, why), started, preempted "
    "(by whom), resumed, finished", opt={"permission": Permission.JOBS_READ},
    responses=responses(400, 401, 403, 404, 503),
)  # fmt: skip
async def job_events(request: Request[Any, Any, Any], job_id: FromPath[str]) -> JobTimeline:
    return await jobs.events(gateway(request), principal(request), job_id)


@get(
    "/v1/jobs", summary="Jobs, newest first (members: their teams' jobs)", opt={"permission": Permission.JOBS_READ},
    responses=responses(400, 401, 403, 503),
)  # fmt: skip
async def list_jobs(
    request: Request[Any, Any, Any],
    job_state: Annotated[JobState | None, QueryParameter(name="state")] = None,
    team: Annotated[str | None, QueryParameter(name="team", max_length=64)] = None,
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=10_000)] = 100,
) -> Response[list[JobView]]:
    gw = gateway(request)
    who = principal(request)
    gw.require_bus()
    key = ("jobs", job_state, team, limit, who.team_scope)
    data = gw.responses.get(key, gw.jobs.version)
    if data is None:
        records = jobs.select(gw, who, state=job_state, team=team, limit=limit)
        data = gw.responses.put(key, gw.jobs.version, msgspec.json.encode(jobs.views(records)))
    return raw_json(data)


@delete(
    "/v1/jobs/{job_id:str}", status_code=HTTP_202_ACCEPTED, summary="Cancel a job",
    opt={"permission": Permission.JOBS_WRITE}, responses=responses(400, 401, 403, 404, 409, 503),
)  # fmt: skip
async def cancel_job(request: Request[Any, Any, Any], job_id: FromPath[str]) -> JobView:
    return await jobs.cancel(gateway(request), principal(request), job_id)


ROUTES = [submit_job, get_job, job_events, list_jobs, cancel_job]
