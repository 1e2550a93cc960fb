"""Node and GPU health over HTTP: state and history from the health audit stream; cordon and release for
operators (as commands to the health service, which owns every health cordon)."""

from typing import Annotated

import msgspec
from litestar import get, post
from litestar.datastructures import State
from litestar.exceptions import NotFoundException
from litestar.params import Body, FromPath, JSONBody
from litestar.status_codes import HTTP_202_ACCEPTED

from chamber.common.contracts import FaultInjection, GpuHealthVerdict, HealthCommand, HealthState
from chamber.gateway.core.views import NodeView, node_views
from chamber.gateway.state import GatewayState

HISTORY_S = 7 * 86400.0


class GpuHealthView(msgspec.Struct, kw_only=True):
    node: str
    index: int
    uuid: str
    model: str
    state: HealthState
    reason: str = ""
    action: str = ""
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


class OperatorOrder(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    reason: Annotated[str, msgspec.Meta(max_length=500)] = ""
    gpu: Annotated[int, msgspec.Meta(ge=0)] | None = None
    """One GPU of the node; the whole node when absent."""


def _gw(state: State) -> GatewayState:
    gw: GatewayState = state.gateway
    return gw


async def _node_health(gw: GatewayState, name: str) -> NodeHealthView:
    node = gw.nodes.get(name)
    if node is None:
        raise NotFoundException(f"no node {name!r}")
    snap = await gw.ledger.snapshot()
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


@get("/v1/nodes/{name:str}", summary="A node: its GPUs, their health, allocation and health history")
async def get_node(name: FromPath[str], state: State) -> NodeHealthView:
    return await _node_health(_gw(state), name)


@get("/v1/gpus/{uuid:str}", summary="A GPU by UUID: health, allocation and history")
async def get_gpu(uuid: FromPath[str], state: State) -> GpuHealthView:
    gw = _gw(state)
    for node in gw.nodes.values():
        for g in node.gpus:
            if g.uuid == uuid:
                view = await _node_health(gw, node.name)
                return next(v for v in view.gpus if v.index == g.index)
    raise NotFoundException(f"no GPU {uuid!r}")


async def _order(gw: GatewayState, name: str, order: OperatorOrder, command: str) -> NodeHealthView:
    node = gw.nodes.get(name)
    if node is None:
        raise NotFoundException(f"no node {name!r}")
    if order.gpu is not None and order.gpu not in {g.index for g in node.gpus}:
        raise NotFoundException(f"node {name} has no GPU {order.gpu}")
    cmd = HealthCommand(node=name, gpu_index=order.gpu, command=command, reason=order.reason,  # type: ignore[arg-type]
                        issued_at=gw.clock.now())  # fmt: skip
    await gw.bus.publish(gw.bus.names.health_command(name), cmd)
    return await _node_health(gw, name)


@post("/v1/nodes/{name:str}/cordon", status_code=HTTP_202_ACCEPTED, summary="Take a node (or one GPU) out (admin)")
async def cordon_node(
    name: FromPath[str], state: State, data: Annotated[OperatorOrder | None, Body()] = None
) -> NodeHealthView:
    return await _order(_gw(state), name, data or OperatorOrder(), "cordon")


@post("/v1/nodes/{name:str}/release", status_code=HTTP_202_ACCEPTED, summary="Bring a node (or GPU) back (admin)")
async def release_node(
    name: FromPath[str], state: State, data: Annotated[OperatorOrder | None, Body()] = None
) -> NodeHealthView:
    return await _order(_gw(state), name, data or OperatorOrder(), "release")


@post("/v1/sim/faults", status_code=HTTP_202_ACCEPTED, summary="Inject a fault into the simulated fleet")
async def inject_fault(data: JSONBody[FaultInjection], state: State) -> FaultInjection:
    """For demos and tests: the simulated collector makes the GPU (or node) show the fault in its telemetry."""
    gw = _gw(state)
    if data.node not in gw.nodes:
        raise NotFoundException(f"no node {data.node!r}")
    await gw.bus.publish(gw.bus.names.subject("control.sim.faults"), data)
    return data


ROUTES = [get_node, get_gpu, cordon_node, release_node, inject_fault]
