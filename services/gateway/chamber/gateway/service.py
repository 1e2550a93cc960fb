"""The gateway process: the HTTP API served by uvicorn until asked to stop."""

import asyncio
import contextlib
from collections.abc import Generator

import uvicorn

from chamber.common.log import get_logger
from chamber.common.runtime import Context
from chamber.gateway.api import create_app
from chamber.gateway.state import GatewayState

log = get_logger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service runtime owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def main(ctx: Context, stop: asyncio.Event) -> None:
    app = create_app(GatewayState(ctx))
    config = uvicorn.Config(
        app, host=ctx.settings.http_host, port=ctx.settings.http_port, log_config=None, access_log=False
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    log.info("gateway.listening", url=f"http://{ctx.settings.http_host}:{ctx.settings.http_port}")
    stopped = asyncio.create_task(stop.wait())
    intake = None
    if ctx.settings.kube_api:  # Kubernetes intake: admission webhooks and the Job watcher (docs/kubernetes.md)
        from chamber.gateway import kube_intake

        intake = asyncio.create_task(kube_intake.run(ctx, stop))
    watched = [serving, stopped] if intake is None else [serving, stopped, intake]
    await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
    if intake is not None:
        stop.set()
        await intake  # an intake that failed fails the gateway, so it is restarted rather than half-alive
