"""The gateway process: the HTTP API and the dashboard (uvicorn) and the gRPC API (grpc.aio), until asked to stop."""

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn

from chamber.common.log import get_logger
from chamber.common.runtime import Context
from chamber.gateway.api import create_app
from chamber.gateway.rpc.server import RpcServer
from chamber.gateway.state import GatewayState

log = get_logger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service runtime owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _http_impl() -> "type[asyncio.Protocol] | str":
    """httptools (C parser) when installed: a large share of a cached read's cost is parsing; with it, one write a
    response (`http_protocol`)."""
    try:
        from chamber.gateway.http_protocol import OneWritePerTurn
    except ImportError:
        return "h11"
    return OneWritePerTurn


async def main(ctx: Context, stop: asyncio.Event) -> None:
    gateway = GatewayState(ctx)
    app = create_app(gateway)
    config = uvicorn.Config(
        app, host=ctx.settings.http_host, port=ctx.settings.http_port, log_config=None, access_log=False,
        http=_http_impl(), loop="none", timeout_graceful_shutdown=3, backlog=4096,
    )  # fmt: skip
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn offers a flag, not an event
        await asyncio.sleep(0.02)
    if serving.done():
        await serving
        return
    log.info("gateway.listening", url=f"http://{ctx.settings.http_host}:{ctx.settings.http_port}")
    rpc = RpcServer(gateway, ctx.settings.http_host, ctx.settings.grpc_port)
    await rpc.start()
    intake = None
    try:
        stopped = asyncio.create_task(stop.wait())
        if ctx.settings.kube_api:  # Kubernetes intake: admission webhooks and the Job watcher (docs/kubernetes.md)
            from chamber.gateway import kube_intake

            intake = asyncio.create_task(kube_intake.run(ctx, stop, gateway.intake))
        watched = [serving, stopped] if intake is None else [serving, stopped, intake]
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await rpc.stop()
        server.should_exit = True
        await serving
        if intake is not None:
            stop.set()
            await intake  # an intake that failed fails the gateway, so it is restarted rather than half-alive
