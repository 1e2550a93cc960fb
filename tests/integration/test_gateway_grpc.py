"""The gRPC API on a running gateway: health and reflection, the same tokens and roles as HTTP, the same checks
(invalid and impossible jobs), every service, and a live watch."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import msgspec
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from chamber.cli.infra import free_port
from chamber.collector import service as collector
from chamber.common.settings import Settings
from chamber.gateway import service as gateway
from chamber.gateway.rpc import chamber_pb2 as pb
from chamber.gateway.rpc import chamber_pb2_grpc as pb_grpc
from chamber.scheduler import service as scheduler
from tests.support.gateway import gateway_client
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


def auth(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def channel(settings: Settings, cleanup: None) -> AsyncIterator[tuple[grpc.aio.Channel, Settings]]:
    live = msgspec.structs.replace(settings, http_port=free_port(), grpc_port=free_port())
    services = (("collector", collector.main), ("scheduler", scheduler.main), ("gateway", gateway.main))
    async with running(live, *services), grpc.aio.insecure_channel(f"127.0.0.1:{live.grpc_port}") as chan:
        health = health_pb2_grpc.HealthStub(chan)

        async def serving() -> bool:
            try:
                reply = await health.Check(health_pb2.HealthCheckRequest(service="chamber.v1.Jobs"))
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        await eventually(serving, what="the gRPC server")
        fleet = pb_grpc.FleetStub(chan)

        async def inventory() -> bool:
            reply = await fleet.Get(pb.Empty(), metadata=auth(settings.admin_token))
            return bool(reply.gpus_total == 32)

        await eventually(inventory, what="inventory")
        yield chan, live


async def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    code: grpc.StatusCode = info.value.code()
    return code


async def test_reflection_lists_the_services(channel: tuple[grpc.aio.Channel, Settings]) -> None:
    chan, _ = channel
    stub = reflection_pb2_grpc.ServerReflectionStub(chan)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    names = set()
    async for reply in stub.ServerReflectionInfo(iter([request])):
        names |= {s.name for s in reply.list_services_response.service}
    assert {"chamber.v1.Jobs", "chamber.v1.Fleet", "chamber.v1.Teams", "grpc.health.v1.Health"} <= names


async def test_jobs_fleet_and_teams_with_the_same_tokens_and_checks(
    channel: tuple[grpc.aio.Channel, Settings], settings: Settings
) -> None:
    chan, live = channel
    jobs = pb_grpc.JobsStub(chan)
    admin = auth(settings.admin_token)
    request = pb.SubmitJobRequest(name="grpc-job", team="ml", gpus_per_replica=8, replicas=2, duration_s=30)
    assert await _code(jobs.Submit(request)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(jobs.Submit(request, metadata=auth("wrong"))) == grpc.StatusCode.UNAUTHENTICATED
    async with gateway_client(live) as http:
        viewer = (await http.post("/v1/tokens", json={"name": "v", "role": "viewer"})).json()["token"]
        audit_before = len((await http.get("/v1/audit")).json())
    assert await _code(jobs.Submit(request, metadata=auth(viewer))) == grpc.StatusCode.PERMISSION_DENIED
    invalid = pb.SubmitJobRequest(name="x", team="ml", gpus_per_replica=0)
    assert await _code(jobs.Submit(invalid, metadata=admin)) == grpc.StatusCode.INVALID_ARGUMENT
    impossible = pb.SubmitJobRequest(name="x", team="ml", gpus_per_replica=8, replicas=1024)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await jobs.Submit(impossible, metadata=admin)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "never fit" in (refused.value.details() or "")

    job = await jobs.Submit(request, metadata=admin)
    assert job.id
    assert job.state == "pending"
    again = pb.SubmitJobRequest(name="grpc-job", team="ml", gpus_per_replica=8, replicas=2, duration_s=30,
                                idempotency_key="k1")  # fmt: skip
    first = await jobs.Submit(again, metadata=admin)
    assert (await jobs.Submit(again, metadata=admin)).id == first.id

    async def running_now() -> bool:
        return bool((await jobs.Get(pb.JobId(id=job.id), metadata=admin)).state == "running")

    await eventually(running_now, what="the job runs")
    got = await jobs.Get(pb.JobId(id=job.id), metadata=admin)
    assert len(got.placement.gpus) == 16
    listed = await jobs.List(pb.ListJobsRequest(team="ml", state="running"), metadata=admin)
    assert job.id in {j.id for j in listed.jobs}
    timeline = await jobs.Events(pb.JobId(id=job.id), metadata=admin)
    assert [e.kind for e in timeline.events][:3] == ["submitted", "placed", "started"]
    assert await _code(jobs.Get(pb.JobId(id=">"), metadata=admin)) == grpc.StatusCode.NOT_FOUND
    assert (
        await _code(jobs.List(pb.ListJobsRequest(state="sleeping"), metadata=admin)) == grpc.StatusCode.INVALID_ARGUMENT
    )
    cancelled = await jobs.Cancel(pb.JobId(id=job.id), metadata=admin)
    assert cancelled.cancel_requested

    fleet = pb_grpc.FleetStub(chan)
    summary = await fleet.Get(pb.Empty(), metadata=auth(viewer))
    assert summary.gpus_total == 32
    nodes = await fleet.ListNodes(pb.Empty(), metadata=auth(viewer))
    assert len(nodes.nodes) == 4
    teams = pb_grpc.TeamsStub(chan)
    assert isinstance(await teams.List(pb.Empty(), metadata=auth(viewer)), pb.ListTeamsResponse)
    assert await _code(teams.Get(pb.TeamName(name="nobody"), metadata=auth(viewer))) == grpc.StatusCode.NOT_FOUND

    async with gateway_client(live) as http:
        records = (await http.get("/v1/audit")).json()[: len((await http.get("/v1/audit")).json()) - audit_before]
    grpc_calls = [(r["action"], r["outcome"]) for r in records if r["via"] == "grpc"]
    assert ("grpc chamber.v1.Jobs/Submit", "denied") in grpc_calls
    assert ("grpc chamber.v1.Jobs/Submit", "ok") in grpc_calls
    assert ("grpc chamber.v1.Jobs/Cancel", "ok") in grpc_calls
    refusals = {(r["status"], r["outcome"]) for r in records if r["action"] == "grpc chamber.v1.Jobs/Submit"}
    assert (422, "rejected") in refusals, "a job that can never run is audited as HTTP would answer it, not as 500"
    assert all(status < 500 for status, _ in refusals)


async def test_watch_streams_job_changes(channel: tuple[grpc.aio.Channel, Settings], settings: Settings) -> None:
    chan, _ = channel
    jobs = pb_grpc.JobsStub(chan)
    admin = auth(settings.admin_token)
    seen: list[pb.Job] = []

    async def watch() -> None:
        async for change in jobs.Watch(pb.WatchJobsRequest(), metadata=admin):
            seen.append(change)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.3)
    job = await jobs.Submit(pb.SubmitJobRequest(name="w", team="ml", gpus_per_replica=1, duration_s=0.2),
                            metadata=admin)  # fmt: skip
    await eventually(lambda: any(j.id == job.id and j.state == "succeeded" for j in seen), what="watched to the end")
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
