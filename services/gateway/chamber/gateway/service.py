"""The gateway process: the HTTP API (and the dashboard) served by uvicorn until asked to stop."""

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


def _http_impl() -> str:
    """httptools (C parser) when installed: a large share of a cached read's cost is parsing."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


async def main(ctx: Context, stop: asyncio.Event) -> None:
    gateway = GatewayState(ctx)
    app = create_app(gateway)
    config = uvicorn.Config(
        app, host=ctx.settings.http_host, port=ctx.settings.http_port, log_config=None, access_log=False,
        http=_http_impl(), loop="none", timeout_graceful_shutdown=3, backlog=4096,
    )  # fmt: skip
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    log.info("gateway.listening", url=f"http://{ctx.settings.http_host}:{ctx.settings.http_port}")
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait([serving, stopped], return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    await serving
