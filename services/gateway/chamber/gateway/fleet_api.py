"""The fleet over HTTP: totals, metric history, nodes, the GPU heatmap, liveness, and the OpenAPI document."""

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get
from litestar.params import QueryParameter

from chamber.common import contracts
from chamber.common.metrics_names import METRICS
from chamber.gateway.core import requests as bodies
from chamber.gateway.core.authz import Permission
from chamber.gateway.core.views import FleetView, NodeHeat, NodeView, heatmap, node_views
from chamber.gateway.errors import BadRequest, FieldProblem, Unavailable
from chamber.gateway.jobs_api import gateway
from chamber.gateway.problems import raw_json, responses

READ = {"permission": Permission.READ}
Metric = Annotated[str, QueryParameter(name="metric", description=f"one of {', '.join(METRICS)}")]


@get("/v1/nodes", summary="Nodes with their GPUs' allocation and schedulability", opt=READ,
     responses=responses(401, 403, 503))  # fmt: skip
async def list_nodes(request: Request[Any, Any, Any]) -> list[NodeView]:
    gw = gateway(request)
    gw.require_bus()
    snap = await gw.ledger_snapshot()
    return node_views(gw.nodes.values(), snap.owners, snap.cordoned)


@get("/v1/fleet", summary="Fleet totals: GPUs, allocation, utilization, idle cost, queue", opt=READ,
     responses=responses(401, 403, 503))  # fmt: skip
async def get_fleet(request: Request[Any, Any, Any]) -> Response[FleetView]:
    gw = gateway(request)
    gw.require_bus()
    snap = await gw.ledger_snapshot()
    version = (gw.ledger_epoch, snap.version, gw.jobs.version, gw.nodes_version, gw.metrics.at if gw.metrics else None)
    data = gw.responses.get("fleet", version)
    if data is None:
        view = await gw.fleet(snap)
        data = gw.responses.put("fleet", version, msgspec.json.encode(view))
    return raw_json(data)


@get("/v1/fleet/gpus", summary="Every GPU by node: latest utilization, memory, temperature, holder, schedulability",
     opt=READ, responses=responses(401, 403, 503))  # fmt: skip
async def fleet_gpus(request: Request[Any, Any, Any]) -> list[NodeHeat]:
    gw = gateway(request)
    gw.require_bus()
    snap = await gw.ledger_snapshot()
    return heatmap(gw.nodes.values(), gw.latest_telemetry(), snap.owners, snap.cordoned)


HISTORY_RESOLUTION = ((6 * 3600, "1m"), (14 * 86400, "1h"), (400 * 86400, "1d"))


class HistoryView(msgspec.Struct, kw_only=True):
    metric: str
    resolution: str
    points: list[Annotated[list[float], msgspec.Meta(min_length=2, max_length=2)]]
    """[bucket start, mean value] pairs; the last point is the latest snapshot."""


@get("/v1/fleet/history", summary="A fleet metric over time (1-minute, 1-hour or 1-day means)", opt=READ,
     responses=responses(400, 401, 403, 503))  # fmt: skip
async def fleet_history(
    request: Request[Any, Any, Any],
    metric: Metric = "utilization",
    window: Annotated[str, QueryParameter(name="window", pattern=r"^[1-9][0-9]{0,5}[mhd]$(?!\n)")] = "1h",
) -> HistoryView:
    if metric not in METRICS:
        raise BadRequest(f"unknown metric {metric!r}; one of {', '.join(METRICS)}", code="invalid",
                         errors=[FieldProblem(field="metric", message="unknown metric")])  # fmt: skip
    seconds = int(window[:-1]) * {"m": 60, "h": 3600, "d": 86400}[window[-1]]
    resolution = next((r for limit, r in HISTORY_RESOLUTION if seconds <= limit), None)
    if resolution is None:
        raise BadRequest("window too long: at most 400d", code="invalid",
                         errors=[FieldProblem(field="window", message="at most 400d")])  # fmt: skip
    gw = gateway(request)
    since = gw.clock.now() - seconds
    points = [[p.start, p.values.get(metric, 0.0)] for p in await gw.history(resolution, since)]
    if gw.metrics is not None and gw.metrics.at >= since:
        points.append([gw.metrics.at, float(getattr(gw.metrics, metric))])
    return HistoryView(metric=metric, resolution=resolution, points=points)


class Health(msgspec.Struct):
    status: str


@get("/healthz", summary="Liveness and readiness: NATS connected, Redis answering", responses=responses(503))
async def healthz(request: Request[Any, Any, Any]) -> Health:
    problems = await gateway(request).problems()
    if problems:
        raise Unavailable("; ".join(problems))
    return Health(status="ok")


STRICT_BODIES = frozenset(
    name
    for name, cls in vars(bodies).items()
    if isinstance(cls, type) and issubclass(cls, msgspec.Struct) and cls.__struct_config__.forbid_unknown_fields
)
JOB_LINKS = {
    "GetJob": {"operationId": "V1JobsJobIdGetJob", "parameters": {"job_id": "$response.body#/id"}},
    "GetJobEvents": {"operationId": "V1JobsJobIdEventsJobEvents", "parameters": {"job_id": "$response.body#/id"}},
    "CancelJob": {"operationId": "V1JobsJobIdCancelJob", "parameters": {"job_id": "$response.body#/id"}},
}
"""OpenAPI links from a submitted job to what can be done with it (clients and stateful fuzzers follow them)."""


def _array_like() -> dict[str, Any]:
    """Contracts encoded as JSON arrays (GpuRef is `["node", index]`), as msgspec describes them."""
    out: dict[str, Any] = {}
    for name, cls in vars(contracts).items():
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct) and cls.__struct_config__.array_like:
            out[name] = msgspec.json.schema(cls)["$defs"][name]
    return out


ARRAY_LIKE = _array_like()


def refine(schema: dict[str, Any]) -> dict[str, Any]:
    """What Litestar's generator leaves out or gets wrong: the links, `additionalProperties: false` on every
    request body that refuses unknown fields (so clients and fuzzers know extras are a 400), and the array form of
    array-like contracts (Litestar describes them as objects)."""
    created = schema.get("paths", {}).get("/v1/jobs", {}).get("post", {}).get("responses", {}).get("201")
    if created is not None:
        created["links"] = JOB_LINKS
    components = schema.get("components", {}).get("schemas", {})
    for name, component in components.items():
        if name in STRICT_BODIES:
            component["additionalProperties"] = False
    for name, array in ARRAY_LIKE.items():
        if name in components:
            components[name] = array
    return schema


@get("/openapi.json", include_in_schema=False)
async def openapi_json(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw = gateway(request)
    cached = gw.responses.get("openapi", 0)
    if cached is None:
        schema: dict[str, Any] = refine(request.app.openapi_schema.to_schema())
        cached = gw.responses.put("openapi", 0, msgspec.json.encode(schema))
    return raw_json(cached)


ROUTES = [list_nodes, get_fleet, fleet_gpus, fleet_history, healthz, openapi_json]
