"""A live stream of changes as Server-Sent Events (`text/event-stream`): `job` (a job's new view, members: their
teams' only), `fleet` (the fleet totals, at most once a second), `health` (every health verdict), `resync` (the
client fell behind: re-read), and a comment every 15 s to keep proxies from closing the connection. The stream ends
(within `REVALIDATE_S`, and before delivering anything more) once its token is revoked.

    curl -N -H "Authorization: Bearer $TOKEN" localhost:8080/v1/stream?topics=job,fleet
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from litestar import Request, get
from litestar.params import QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from chamber.gateway.core.authz import Permission
from chamber.gateway.errors import BadRequest, FieldProblem
from chamber.gateway.http_edge import bearer, principal
from chamber.gateway.jobs_api import gateway
from chamber.gateway.live import REVALIDATE_S, TOPICS, Subscriber
from chamber.gateway.problems import responses

KEEPALIVE_S = 15.0
TOPICS_HELP = "comma-separated: job, fleet, health"


async def _events(
    request: Request[Any, Any, Any], sub: Subscriber, valid: Callable[[], bool]
) -> AsyncIterator[ServerSentEventMessage]:
    gw = gateway(request)
    loop = asyncio.get_running_loop()
    try:
        yield ServerSentEventMessage(event="hello", data='{"topics": "' + ",".join(sorted(sub.topics)) + '"}')
        quiet_since = loop.time()
        while True:
            try:
                item = await asyncio.wait_for(sub.queue.get(), timeout=REVALIDATE_S)
            except TimeoutError:
                if not valid():
                    return
                if loop.time() - quiet_since >= KEEPALIVE_S:
                    quiet_since = loop.time()
                    yield ServerSentEventMessage(comment="keepalive")
                continue
            if item is None or not valid():
                return
            topic, data = item
            quiet_since = loop.time()
            yield ServerSentEventMessage(event=topic, data=data.decode())
            if sub.lagged and sub.queue.empty():
                sub.lagged = False
                yield ServerSentEventMessage(event="resync", data="{}")
    finally:
        gw.live.unsubscribe(sub)


@get("/v1/stream", summary="Live changes as Server-Sent Events (job, fleet, health)",
     opt={"permission": Permission.READ}, responses=responses(400, 401, 403, 503))  # fmt: skip
async def stream(
    request: Request[Any, Any, Any],
    topics: Annotated[str, QueryParameter(name="topics", max_length=64, description=TOPICS_HELP)] = ",".join(TOPICS),
) -> ServerSentEvent:
    gw = gateway(request)
    wanted = frozenset(t.strip() for t in topics.split(",") if t.strip())
    unknown = wanted - set(TOPICS)
    if unknown or not wanted:
        raise BadRequest(f"unknown topics {sorted(unknown)}; use some of {', '.join(TOPICS)}", code="invalid",
                         errors=[FieldProblem(field="topics", message=f"some of {', '.join(TOPICS)}")])  # fmt: skip
    gw.require_bus()
    who = principal(request)
    token = bearer(request.scope) or ""
    sub = gw.live.subscribe(wanted, who.team_scope)
    gw.mark_dirty()
    return ServerSentEvent(
        _events(request, sub, lambda: gw.tokens.authenticate(token) == who),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


ROUTES = [stream]
