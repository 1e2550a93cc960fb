"""The gRPC front door (grpc.aio): the Jobs, Fleet and Teams services of `chamber.proto`, server reflection and the
standard health service, on its own port in the gateway process.

Every method is a thin adapter over the same operations the HTTP routes call (`chamber.gateway.jobs`, the quota
views): the same token (metadata `authorization: Bearer <token>`), the same role check, the same validation (a
request becomes the API's strict body), the same errors (an ApiError becomes its gRPC status), and mutating calls
go to the same audit trail.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import msgspec
import nats.errors
import redis.exceptions
from google.protobuf import json_format
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from chamber.common.bus.errors import BusError
from chamber.common.contracts import AuditRecord, JobState
from chamber.common.ledger.errors import LedgerUnavailable
from chamber.common.log import get_logger
from chamber.gateway import jobs
from chamber.gateway.core.authz import Permission, Principal, denial
from chamber.gateway.core.requests import SubmitJobRequest
from chamber.gateway.core.views import node_views
from chamber.gateway.errors import ApiError, BadRequest, FieldProblem, Forbidden, Unauthenticated
from chamber.gateway.live import REVALIDATE_S
from chamber.gateway.quota_api import all_teams, check_name, one_team
from chamber.gateway.rpc import chamber_pb2 as pb
from chamber.gateway.rpc import chamber_pb2_grpc as pb_grpc
from chamber.gateway.state import GatewayState

log = get_logger(__name__)

SERVICES = ("chamber.v1.Jobs", "chamber.v1.Fleet", "chamber.v1.Teams")
M = TypeVar("M", bound=Message)


def to_message(value: Any, message: type[M]) -> M:
    """A msgspec view as a protobuf message (fields matched by name; GpuRef pairs become GpuRef messages)."""
    data = _refs(msgspec.to_builtins(value))
    return json_format.ParseDict(data, message(), ignore_unknown_fields=True)


def _refs(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: [_ref(g) for g in v] if k in ("gpus", "nominated") and isinstance(v, list) else _refs(v)
                for k, v in data.items() if v is not None}  # fmt: skip
    if isinstance(data, list):
        return [_refs(v) for v in data]
    return data


def _ref(gpu: Any) -> Any:
    return {"node": gpu[0], "index": gpu[1]} if isinstance(gpu, list) else gpu


class Calls:
    """Authentication, authorization, error mapping and audit, shared by every method."""

    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw

    def principal(self, context: grpc.aio.ServicerContext, permission: Permission) -> Principal:
        token = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str) and value.lower().startswith("bearer "):
                token = value[7:].strip()
        if not token:
            raise Unauthenticated("no token: send metadata 'authorization: Bearer <token>'")
        who = self.gw.tokens.authenticate(token)
        if who is None:
            raise Unauthenticated(self.gw.tokens.refusal(token))
        why = denial(who, permission)
        if why is not None:
            raise Forbidden(why, code="forbidden")
        return who

    async def run(
        self,
        context: grpc.aio.ServicerContext,
        permission: Permission,
        call: Callable[[Principal], Awaitable[M]],
        *,
        audit: str = "",
    ) -> M:
        who: Principal | None = None
        code, status, detail = grpc.StatusCode.OK, 200, ""  # status: what HTTP answers the same outcome with
        result: M | None = None
        try:
            who = self.principal(context, permission)
            result = await call(who)
            detail = getattr(result, "id", "")
        except ApiError as exc:
            code, status, detail = getattr(grpc.StatusCode, exc.grpc_code), exc.status, exc.detail
        except (BusError, LedgerUnavailable, redis.exceptions.RedisError, nats.errors.Error, TimeoutError) as exc:
            code, status, detail = grpc.StatusCode.UNAVAILABLE, 503, f"a dependency is unreachable: {exc}"
        except Exception as exc:
            log.exception("grpc.unexpected", error=repr(exc))
            code, status, detail = grpc.StatusCode.INTERNAL, 500, "internal error; it was logged"
        if audit:
            await self._audit(audit, who, status, detail)
        if code != grpc.StatusCode.OK or result is None:
            await context.abort(code, detail)
            raise AssertionError("abort raises")
        return result

    async def _audit(self, method: str, who: Principal | None, status: int, detail: str) -> None:
        outcome = (
            "ok" if status < 400 else "denied" if status in (401, 403) else "rejected" if status < 500 else "error"
        )
        await self.gw.audit.record(
            AuditRecord(at=self.gw.clock.now(), actor=who.id if who else "anonymous",
                        actor_name=who.name if who else "", role=who.role.value if who else "",
                        action=f"grpc {method}", target=method, status=status, outcome=outcome, detail=detail[:500],
                        via="grpc"),
            "grpc",
        )  # fmt: skip


class JobsService:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.gw = calls.gw

    async def Submit(self, request: pb.SubmitJobRequest, context: grpc.aio.ServicerContext) -> pb.Job:
        async def call(who: Principal) -> pb.Job:
            fields = json_format.MessageToDict(request, preserving_proto_field_name=True)
            key = fields.pop("idempotency_key", None)
            body = _convert(fields, SubmitJobRequest)
            view, _ = await jobs.submit(self.gw, who, body, key)
            return to_message(view, pb.Job)

        return await self.calls.run(context, Permission.JOBS_WRITE, call, audit="chamber.v1.Jobs/Submit")

    async def Get(self, request: pb.JobId, context: grpc.aio.ServicerContext) -> pb.Job:
        async def call(who: Principal) -> pb.Job:
            return to_message(await jobs.get(self.gw, who, request.id), pb.Job)

        return await self.calls.run(context, Permission.JOBS_READ, call)

    async def List(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        async def call(who: Principal) -> pb.ListJobsResponse:
            try:
                state = JobState(request.state) if request.state else None
            except ValueError as exc:
                raise BadRequest(f"unknown state {request.state!r}", code="invalid") from exc
            if not 0 <= request.limit <= 10_000:
                raise BadRequest("limit: 1-10000 (0: 100)", code="invalid")
            self.gw.require_bus()
            records = jobs.select(self.gw, who, state=state, team=request.team or None, limit=request.limit or 100)
            return pb.ListJobsResponse(jobs=[to_message(v, pb.Job) for v in jobs.views(records)])

        return await self.calls.run(context, Permission.JOBS_READ, call)

    async def Cancel(self, request: pb.JobId, context: grpc.aio.ServicerContext) -> pb.Job:
        async def call(who: Principal) -> pb.Job:
            return to_message(await jobs.cancel(self.gw, who, request.id), pb.Job)

        return await self.calls.run(context, Permission.JOBS_WRITE, call, audit="chamber.v1.Jobs/Cancel")

    async def Events(self, request: pb.JobId, context: grpc.aio.ServicerContext) -> pb.JobTimeline:
        async def call(who: Principal) -> pb.JobTimeline:
            return to_message(await jobs.events(self.gw, who, request.id), pb.JobTimeline)

        return await self.calls.run(context, Permission.JOBS_READ, call)

    async def Watch(self, request: pb.WatchJobsRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Job]:
        try:
            who = self.calls.principal(context, Permission.JOBS_READ)
        except ApiError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.grpc_code), exc.detail)
            return
        sub = self.gw.live.subscribe(frozenset({"job"}), who.team_scope)
        try:
            while True:
                try:
                    item = await asyncio.wait_for(sub.queue.get(), timeout=REVALIDATE_S)
                except TimeoutError:
                    await self._recheck(context, who)
                    continue
                if item is None:
                    return
                await self._recheck(context, who)
                if sub.lagged:  # the stream has no way to say "resync": end it, the client re-lists and re-watches
                    await context.abort(grpc.StatusCode.ABORTED, "fell behind the job changes: list and watch again")
                yield json_format.Parse(_job_json(item[1]), pb.Job(), ignore_unknown_fields=True)
        finally:
            self.gw.live.unsubscribe(sub)

    async def _recheck(self, context: grpc.aio.ServicerContext, who: Principal) -> None:
        """End the stream (UNAUTHENTICATED / PERMISSION_DENIED) once its token is revoked or changed."""
        try:
            now = self.calls.principal(context, Permission.JOBS_READ)
        except ApiError as exc:
            await context.abort(getattr(grpc.StatusCode, exc.grpc_code), exc.detail)
        if now != who:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token changed: watch again")


def _job_json(data: bytes) -> str:
    return msgspec.json.encode(_refs(msgspec.json.decode(data))).decode()


def _convert(fields: dict[str, Any], target: type[SubmitJobRequest]) -> SubmitJobRequest:
    try:
        return msgspec.convert(fields, target)
    except msgspec.ValidationError as exc:
        where = str(exc).rsplit(" - at ", 1)[-1].strip("`") if " - at " in str(exc) else "$"
        raise BadRequest(f"invalid request: {exc}", code="invalid",
                         errors=[FieldProblem(field=where, message=str(exc))]) from exc  # fmt: skip


class FleetService:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.gw = calls.gw

    async def Get(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.FleetSummary:
        async def call(who: Principal) -> pb.FleetSummary:
            self.gw.require_bus()
            return to_message(await self.gw.fleet(), pb.FleetSummary)

        return await self.calls.run(context, Permission.READ, call)

    async def ListNodes(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.ListNodesResponse:
        async def call(who: Principal) -> pb.ListNodesResponse:
            self.gw.require_bus()
            snap = await self.gw.ledger_snapshot()
            views = node_views(self.gw.nodes.values(), snap.owners, snap.cordoned)
            return pb.ListNodesResponse(nodes=[to_message(v, pb.Node) for v in views])

        return await self.calls.run(context, Permission.READ, call)


class TeamsService:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.gw = calls.gw

    @staticmethod
    def _team(view: Any) -> pb.Team:
        config = view.config
        team = pb.Team(name=view.name, org=config.org if config else view.usage.org,
                       cohort=config.cohort if config else "", weight=config.weight if config else 0.0)  # fmt: skip
        team.usage.CopyFrom(to_message(view.usage, pb.TeamUsage))
        return team

    async def List(self, request: pb.Empty, context: grpc.aio.ServicerContext) -> pb.ListTeamsResponse:
        async def call(who: Principal) -> pb.ListTeamsResponse:
            return pb.ListTeamsResponse(teams=[self._team(v) for v in await all_teams(self.gw)])

        return await self.calls.run(context, Permission.READ, call)

    async def Get(self, request: pb.TeamName, context: grpc.aio.ServicerContext) -> pb.Team:
        async def call(who: Principal) -> pb.Team:
            check_name("team", request.name)
            return self._team(await one_team(self.gw, request.name))

        return await self.calls.run(context, Permission.READ, call)


class RpcServer:
    """The grpc.aio server bound to `host:port` (0: a free port, then `port` says which)."""

    def __init__(self, gw: GatewayState, host: str, port: int) -> None:
        self.gw = gw
        self.server = grpc.aio.server()
        calls = Calls(gw)
        pb_grpc.add_JobsServicer_to_server(JobsService(calls), self.server)
        pb_grpc.add_FleetServicer_to_server(FleetService(calls), self.server)
        pb_grpc.add_TeamsServicer_to_server(TeamsService(calls), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (*SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen for gRPC on {host}:{port} (in use?)")

    async def start(self) -> None:
        await self.server.start()
        for name in ("", *SERVICES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gateway.grpc_listening", port=self.port)

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=2.0)


async def serve_until(gw: GatewayState, host: str, port: int, stop: asyncio.Event) -> None:
    server = RpcServer(gw, host, port)
    await server.start()
    try:
        await stop.wait()
    finally:
        await server.stop()
