"""Node and GPU health over HTTP: state and history from the health audit stream; cordon and release for
operators (as commands to the health service, which owns every health cordon); simulated faults for demos."""

from typing import Annotated, Any

import msgspec
from litestar import Request, get, post
from litestar.params import Body, FromPath, JSONBody
from litestar.status_codes import HTTP_202_ACCEPTED

from chamber.common.bus import PublishError
from chamber.common.contracts import GpuHealthVerdict, HealthCommand, HealthState, Node
from chamber.gateway.core.authz import Permission
from chamber.gateway.core.requests import FaultRequest, OperatorOrder
from chamber.gateway.core.views import NodeView, node_views
from chamber.gateway.errors import BadRequest, FieldProblem, NotFound, Unavailable
from chamber.gateway.http_edge import body
from chamber.gateway.jobs_api import gateway
from chamber.gateway.problems import responses
from chamber.gateway.state import GatewayState

HISTORY_S = 7 * 86400.0
READ = {"permission": Permission.READ}
OPERATE = {"permission": Permission.NODES_OPERATE}
GPU_FAULTS = frozenset({"xid", "dbe", "row_remap_failure", "nvlink_replay", "thermal"})


class GpuHealthView(msgspec.Struct, kw_only=True):
    node: str
    index: int
    uuid: str
    model: str
    state: HealthState
    reason: str = ""
    action: str = ""
    """What an operator should do: `reset-gpu`, `reboot-node`, `rma`, or empty."""
    allocated_to: str | None = None
    history: list[GpuHealthVerdict] = msgspec.field(default_factory=list)


class NodeHealthView(msgspec.Struct, kw_only=True):
    node: NodeView
    state: HealthState
    reason: str = ""
    action: str = ""
    gpus: list[GpuHealthView]
    history: list[GpuHealthVerdict]
    """Every health decision about the node and its GPUs in the last 7 days, oldest first."""


def _node(gw: GatewayState, name: str) -> Node:
    node = gw.nodes.get(name)
    if node is None:
        raise NotFound(f"no node {name!r}", code="no-such-node")
    return node


async def _node_health(gw: GatewayState, name: str) -> NodeHealthView:
    node = _node(gw, name)
    snap = await gw.ledger_snapshot()
    history = await gw.health_history(name, gw.clock.now() - HISTORY_S)
    latest: dict[int | None, GpuHealthVerdict] = {}
    for verdict in history:
        if not verdict.breaker_open:
            latest[verdict.gpu_index] = verdict
    gpus = []
    for g in node.gpus:
        v = latest.get(g.index)
        holder = snap.owners.get(f"{name}/{g.index}")
        gpus.append(
            GpuHealthView(
                node=name, index=g.index, uuid=g.uuid, model=g.model,
                state=v.state if v else HealthState.HEALTHY, reason=v.reason if v else "",
                action=v.action if v else "", allocated_to=holder.rsplit("/", 1)[0] if holder else None,
                history=[h for h in history if h.gpu_index == g.index],
            )
        )  # fmt: skip
    whole = latest.get(None)
    (view,) = node_views([node], snap.owners, snap.cordoned)
    return NodeHealthView(
        node=view, state=whole.state if whole else HealthState.HEALTHY, reason=whole.reason if whole else "",
        action=whole.action if whole else "", gpus=gpus, history=history,
    )  # fmt: skip


@get("/v1/nodes/{name:str}", summary="A node: its GPUs, their health, allocation and health history", opt=READ,
     responses=responses(400, 401, 403, 404, 503))  # fmt: skip
async def get_node(request: Request[Any, Any, Any], name: FromPath[str]) -> NodeHealthView:
    return await _node_health(gateway(request), name)


@get("/v1/gpus/{uuid:str}", summary="A GPU by UUID: health, allocation and history", opt=READ,
     responses=responses(400, 401, 403, 404, 503))  # fmt: skip
async def get_gpu(request: Request[Any, Any, Any], uuid: FromPath[str]) -> GpuHealthView:
    gw = gateway(request)
    for node in gw.nodes.values():
        for g in node.gpus:
            if g.uuid == uuid:
                view = await _node_health(gw, node.name)
                return next(v for v in view.gpus if v.index == g.index)
    raise NotFound(f"no GPU {uuid!r}", code="no-such-gpu")


def _check_gpu(node: Node, gpu: int | None) -> None:
    indices = sorted(g.index for g in node.gpus)
    if gpu is not None and gpu not in indices:
        span = f"{indices[0]}-{indices[-1]}" if indices else "none"
        raise BadRequest(f"node {node.name} has no GPU {gpu} (its GPUs: {span})", code="no-such-gpu",
                         errors=[FieldProblem(field="$.gpu", message=f"out of range {span}")])  # fmt: skip


async def _publish(gw: GatewayState, subject: str, event: msgspec.Struct) -> None:
    gw.require_bus()
    try:
        await gw.bus.publish(subject, event)
    except PublishError as exc:
        raise Unavailable(f"the order was not stored: {exc}") from exc


async def _order(request: Request[Any, Any, Any], name: str, command: str) -> NodeHealthView:
    gw = gateway(request)
    order: OperatorOrder = body(request) or OperatorOrder()
    node = _node(gw, name)
    _check_gpu(node, order.gpu)
    cmd = HealthCommand(node=name, gpu_index=order.gpu, command=command, reason=order.reason,  # type: ignore[arg-type]
                        issued_at=gw.clock.now())  # fmt: skip
    await _publish(gw, gw.bus.names.health_command(name), cmd)
    gw.ledger_changed()
    return await _node_health(gw, name)


@post("/v1/nodes/{name:str}/cordon", status_code=HTTP_202_ACCEPTED, opt=OPERATE,
      summary="Take a node (or one GPU) out of scheduling (operators)",
      responses=responses(400, 401, 403, 404, 413, 503))  # fmt: skip
async def cordon_node(
    request: Request[Any, Any, Any], name: FromPath[str], data: Annotated[OperatorOrder | None, Body()] = None
) -> NodeHealthView:
    return await _order(request, name, "cordon")


@post("/v1/nodes/{name:str}/release", status_code=HTTP_202_ACCEPTED, opt=OPERATE,
      summary="Bring a node (or GPU) back, also a repeat offender (operators)",
      responses=responses(400, 401, 403, 404, 413, 503))  # fmt: skip
async def release_node(
    request: Request[Any, Any, Any], name: FromPath[str], data: Annotated[OperatorOrder | None, Body()] = None
) -> NodeHealthView:
    return await _order(request, name, "release")


@post("/v1/sim/faults", status_code=HTTP_202_ACCEPTED, opt=OPERATE,
      summary="Inject a fault into the simulated fleet (operators)",
      responses=responses(400, 401, 403, 404, 413, 503))  # fmt: skip
async def inject_fault(request: Request[Any, Any, Any], data: JSONBody[FaultRequest]) -> FaultRequest:
    """For demos and tests: the simulated collector makes the GPU (or node) show the fault in its telemetry.
    GPU faults need `gpu`; `heartbeat_loss` silences the whole node; `clear` repairs (one GPU or the node)."""
    gw = gateway(request)
    fault: FaultRequest = body(request)
    node = _node(gw, fault.node)
    _check_gpu(node, fault.gpu)
    if fault.fault in GPU_FAULTS and fault.gpu is None:
        raise BadRequest(f"fault {fault.fault!r} is about one GPU: give `gpu`", code="invalid",
                         errors=[FieldProblem(field="$.gpu", message="required for this fault")])  # fmt: skip
    if fault.fault == "xid" and fault.value < 1:
        raise BadRequest("an `xid` fault needs the XID number in `value` (e.g. 79)", code="invalid",
                         errors=[FieldProblem(field="$.value", message="the XID number, >= 1")])  # fmt: skip
    await _publish(gw, gw.bus.names.subject("control.sim.faults"), fault.to_event())
    return fault


ROUTES = [get_node, get_gpu, cordon_node, release_node, inject_fault]
