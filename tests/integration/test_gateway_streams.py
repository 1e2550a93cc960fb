"""Long-lived streams end when they must: a revoked token loses its open SSE stream and gRPC watch (before anything
more is delivered), and a gRPC watcher that fell behind is told so (ABORTED) instead of silently losing every
later change."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import msgspec
import pytest
import uvicorn

from chamber.cli.infra import free_port
from chamber.common.contracts import JobRecord, JobSpec, JobState
from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.gateway.api import create_app
from chamber.gateway.core.views import job_view
from chamber.gateway.rpc import chamber_pb2 as pb
from chamber.gateway.rpc import chamber_pb2_grpc as pb_grpc
from chamber.gateway.rpc.server import RpcServer
from chamber.gateway.state import GatewayState
from tests.support.gateway import bearer, gateway_client
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def _change(i: int, team: str = "ml") -> bytes:
    record = JobRecord(id=f"js{i}", spec=JobSpec(name=f"n{i}", team=team, gpus_per_replica=1), state=JobState.PENDING,
                       submitted_at=1.0, updated_at=1.0)  # fmt: skip
    return msgspec.json.encode(job_view(record))


@contextlib.asynccontextmanager
async def _served(settings: Settings) -> AsyncIterator[tuple[str, GatewayState]]:
    """The gateway app on a real port (the SSE stream needs a real server to stream through)."""
    port = free_port()
    app = create_app(GatewayState(make_context(settings, "gateway")))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, loop="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:

        async def started() -> bool:
            return bool(server.started)

        await eventually(started, what="the gateway's HTTP server")
        yield f"http://127.0.0.1:{port}", app.state.gateway
    finally:
        server.should_exit = True
        await task


async def test_sse_stream_ends_when_its_token_is_revoked(settings: Settings, cleanup: None) -> None:
    admin = bearer(settings.admin_token)
    async with _served(settings) as (base, gw), httpx.AsyncClient(base_url=base, timeout=10) as client:
        made = await client.post("/v1/tokens", json={"name": "m", "role": "member", "teams": ["ml"]}, headers=admin)
        member = bearer(made.json()["token"])
        lines: list[str] = []
        hello = asyncio.Event()

        async def read() -> None:
            async with client.stream("GET", "/v1/stream?topics=job", headers=member, timeout=None) as reply:
                assert reply.status_code == 200
                async for line in reply.aiter_lines():
                    lines.append(line)
                    if line == "event: hello":
                        hello.set()

        reader = asyncio.create_task(read())
        await asyncio.wait_for(hello.wait(), 5)
        gw.live.publish("job", _change(0), team="ml")
        await asyncio.sleep(0.3)
        assert any(line.startswith("data:") and "js0" in line for line in lines)
        assert (await client.delete(f"/v1/tokens/{made.json()['id']}", headers=admin)).status_code == 204
        assert (await client.get("/v1/jobs", headers=member)).status_code == 401
        seen = len(lines)
        gw.live.publish("job", _change(1), team="ml")
        await asyncio.wait_for(reader, 3)  # the stream ends by itself
        assert not [line for line in lines[seen:] if line.startswith(("event:", "data:"))]


@contextlib.asynccontextmanager
async def _rpc(settings: Settings) -> AsyncIterator[tuple[Any, GatewayState, pb_grpc.JobsStub]]:
    async with gateway_client(settings) as admin:
        gw = admin.app.state.gateway
        server = RpcServer(gw, "127.0.0.1", 0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as chan:
                yield admin, gw, pb_grpc.JobsStub(chan)
        finally:
            await server.stop()


async def test_grpc_watch_ends_unauthenticated_when_its_token_is_revoked(settings: Settings, cleanup: None) -> None:
    async with _rpc(settings) as (admin, gw, jobs):
        made = (await admin.post("/v1/tokens", json={"name": "m", "role": "member", "teams": ["ml"]})).json()
        call = jobs.Watch(pb.WatchJobsRequest(), metadata=(("authorization", f"Bearer {made['token']}"),))
        await asyncio.sleep(0.3)
        gw.live.publish("job", _change(0), team="ml")
        assert (await asyncio.wait_for(call.read(), 3)).id == "js0"
        assert (await admin.delete(f"/v1/tokens/{made['id']}")).status_code == 204
        gw.live.publish("job", _change(1), team="ml")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(call.read(), 3)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_grpc_watch_that_fell_behind_ends_aborted(settings: Settings, cleanup: None) -> None:
    async with _rpc(settings) as (_, gw, jobs):
        call = jobs.Watch(pb.WatchJobsRequest(), metadata=(("authorization", f"Bearer {settings.admin_token}"),))
        await asyncio.sleep(0.3)
        for i in range(3000):  # more than the subscriber's queue holds, within one loop tick
            gw.live.publish("job", _change(i), team="ml")
        seen: list[str] = []

        async def drain() -> None:
            async for job in call:
                seen.append(job.id)

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await asyncio.wait_for(drain(), 5)
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert "fell behind" in (info.value.details() or "")
        assert len(seen) <= 2048
