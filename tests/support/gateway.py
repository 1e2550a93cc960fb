"""The gateway's HTTP app in the test's event loop, with clients that carry a token."""

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from litestar.testing import AsyncTestClient

from chamber.common.runtime import make_context
from chamber.common.settings import Settings
from chamber.gateway.api import create_app
from chamber.gateway.state import GatewayState


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def gateway_client(settings: Settings, token: str | None = None) -> AsyncIterator[AsyncTestClient[Any]]:
    """A client of a fresh gateway app; it sends `token` (default: the settings' admin token) on every request."""
    app = create_app(GatewayState(make_context(settings, "gateway")))
    async with AsyncTestClient(app=app) as client:
        client.headers.update(bearer(token or settings.admin_token))
        yield client
