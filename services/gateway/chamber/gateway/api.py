"""HTTP routes (Litestar, msgspec-native): validate, publish to the bus, read from the views.

Writes never touch state directly: a submit or cancel is an event on the durable JOBS stream, acknowledged
by JetStream before the API answers, so an accepted request is never lost.
"""

import secrets
from typing import Annotated, Any, Literal

import msgspec
from litestar import Litestar, Request, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import ClientException, HTTPException, NotFoundException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_202_ACCEPTED, HTTP_409_CONFLICT, HTTP_503_SERVICE_UNAVAILABLE

from chamber.common.contracts import TERMINAL_STATES, JobCancelRequested, JobSpec, JobState, JobSubmitted, Topology
from chamber.common.contracts.jobs import Argv, EnvVars, Image, JobName, TeamName, WorkingDir
from chamber.common.metrics_names import METRICS
from chamber.common.priorities import DEFAULT_CLASSES
from chamber.common.workload import workload_problem
from chamber.gateway.core.views import (
    FleetView,
    JobView,
    NodeView,
    fleet_view,
    job_view,
    node_views,
    submitted_view,
)
from chamber.gateway.health_api import ROUTES as HEALTH_ROUTES
from chamber.gateway.logs_api import ROUTES as LOGS_ROUTES
from chamber.gateway.quota_api import ROUTES as QUOTA_ROUTES
from chamber.gateway.state import GatewayState


class SubmitJobRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: JobName
    team: TeamName
    gpus_per_replica: Annotated[int, msgspec.Meta(ge=1, le=64)]
    replicas: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 1
    priority: str = "train"
    duration_s: Annotated[float, msgspec.Meta(ge=0, le=365 * 86400)] | None = None
    max_runtime_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    min_runtime_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    checkpoint_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    pool: str | None = None
    gpu_model: str | None = None
    topology: Topology | None = None
    checkpoint_interval_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    requeue: Literal["always", "never"] = "always"
    command: Argv | None = None
    env: EnvVars = msgspec.field(default_factory=dict)
    working_dir: WorkingDir | None = None
    image: Image | None = None


def new_job_id(now: float) -> str:
    """Time-ordered and unique: milliseconds since the epoch in hex, then 32 random bits."""
    return f"j{int(now * 1000):011x}{secrets.token_hex(4)}"


def _gw(state: State) -> GatewayState:
    gw: GatewayState = state.gateway
    return gw


def _validate(body: SubmitJobRequest, gw: GatewayState) -> JobSpec:
    if body.priority not in DEFAULT_CLASSES:
        raise ValidationException(f"unknown priority {body.priority!r}; use one of {', '.join(DEFAULT_CLASSES)}")
    largest = gw.largest_node_gpus()
    if largest and body.gpus_per_replica > largest:
        raise ValidationException(
            f"gpus_per_replica={body.gpus_per_replica} exceeds the largest node ({largest} GPUs); "
            "split the job into more replicas"
        )
    spec = msgspec.convert(msgspec.structs.asdict(body), JobSpec)
    problem = workload_problem(spec, gw.ctx.settings.executor)
    if problem is not None:
        raise ValidationException(problem)
    return spec


@post("/v1/jobs", summary="Submit a job")
async def submit_job(data: JSONBody[SubmitJobRequest], state: State) -> JobView:
    gw = _gw(state)
    spec = _validate(data, gw)
    now = gw.clock.now()
    job_id = new_job_id(now)
    await gw.bus.publish(
        gw.bus.names.job_submit(job_id), JobSubmitted(job_id=job_id, spec=spec, submitted_at=now), msg_id=job_id
    )
    return submitted_view(job_id, spec, now)


@get("/v1/jobs/{job_id:str}", summary="One job, with the reason for its state")
async def get_job(job_id: FromPath[str], state: State) -> JobView:
    view = await _gw(state).job(job_id)
    if view is None:
        raise NotFoundException(f"no job {job_id!r}")
    return view


@get("/v1/jobs", summary="Jobs, newest first")
async def list_jobs(
    state: State,
    job_state: Annotated[JobState | None, QueryParameter(name="state")] = None,
    team: Annotated[str | None, QueryParameter(name="team")] = None,
    limit: Annotated[int, QueryParameter(name="limit", ge=1, le=10_000)] = 100,
) -> list[JobView]:
    records = sorted(_gw(state).records.values(), key=lambda r: (r.submitted_at, r.id), reverse=True)
    out = []
    for r in records:
        if (job_state is None or r.state == job_state) and (team is None or r.spec.team == team):
            out.append(job_view(r))
            if len(out) >= limit:
                break
    return out


@delete("/v1/jobs/{job_id:str}", status_code=HTTP_202_ACCEPTED, summary="Cancel a job")
async def cancel_job(job_id: FromPath[str], state: State) -> JobView:
    gw = _gw(state)
    view = await gw.job(job_id)
    if view is None:
        raise NotFoundException(f"no job {job_id!r}")
    if view.state in TERMINAL_STATES:
        raise ClientException(f"job {job_id} already {view.state}", status_code=HTTP_409_CONFLICT)
    await gw.bus.publish(
        gw.bus.names.job_cancel(job_id),
        JobCancelRequested(job_id=job_id, requested_at=gw.clock.now()),
        msg_id=f"{job_id}:cancel",
    )
    return msgspec.structs.replace(view, cancel_requested=True)


@get("/v1/nodes", summary="Nodes with their GPUs' allocation and schedulability")
async def list_nodes(state: State) -> list[NodeView]:
    gw = _gw(state)
    snap = await gw.ledger.snapshot()
    return node_views(gw.nodes.values(), snap.owners, snap.cordoned)


@get("/v1/fleet", summary="Fleet totals")
async def get_fleet(state: State) -> FleetView:
    gw = _gw(state)
    snap = await gw.ledger.snapshot()
    return fleet_view(node_views(gw.nodes.values(), snap.owners, snap.cordoned), gw.records.values(), gw.metrics)


HISTORY_RESOLUTION = ((6 * 3600, "1m"), (14 * 86400, "1h"), (400 * 86400, "1d"))


class HistoryView(msgspec.Struct, kw_only=True):
    metric: str
    resolution: str
    points: list[tuple[float, float]]
    """(bucket start, mean value); the last point is the latest snapshot."""


@get("/v1/fleet/history", summary="A fleet metric over time (1-minute, 1-hour or 1-day means)")
async def fleet_history(
    state: State,
    metric: Annotated[str, QueryParameter(name="metric")] = "utilization",
    window: Annotated[str, QueryParameter(name="window", pattern=r"^[0-9]+[mhd]$")] = "1h",
) -> HistoryView:
    if metric not in METRICS:
        raise ValidationException(f"unknown metric {metric!r}; one of {', '.join(METRICS)}")
    seconds = int(window[:-1]) * {"m": 60, "h": 3600, "d": 86400}[window[-1]]
    resolution = next((r for limit, r in HISTORY_RESOLUTION if seconds <= limit), None)
    if resolution is None:
        raise ValidationException("window too long: at most 400d")
    gw = _gw(state)
    since = gw.clock.now() - seconds
    points = [(p.start, p.values.get(metric, 0.0)) for p in await gw.history(resolution, since)]
    if gw.metrics is not None and gw.metrics.at >= since:
        points.append((gw.metrics.at, float(getattr(gw.metrics, metric))))
    return HistoryView(metric=metric, resolution=resolution, points=points)


@get("/healthz", summary="Liveness and readiness: NATS connected, Redis answering")
async def healthz(state: State) -> dict[str, str]:
    gw = _gw(state)
    problems = await gw.problems()
    if problems:
        raise HTTPException(detail="; ".join(problems), status_code=HTTP_503_SERVICE_UNAVAILABLE)
    return {"status": "ok"}


@get("/openapi.json", include_in_schema=False)
async def openapi_json(request: Request[Any, Any, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi_schema.to_schema()
    return schema


ROUTES = [
    submit_job, get_job, list_jobs, cancel_job, list_nodes, get_fleet, fleet_history, healthz, openapi_json,
    *QUOTA_ROUTES,
    *HEALTH_ROUTES,
    *LOGS_ROUTES,
]  # fmt: skip


def create_app(gateway: GatewayState) -> Litestar:
    return Litestar(
        route_handlers=ROUTES,
        state=State({"gateway": gateway}),
        openapi_config=OpenAPIConfig(title="Chamber", version="0.1.0", path="/schema"),
        on_startup=[gateway.start],
        on_shutdown=[gateway.stop],
    )
