"""The HTTP application (Litestar, msgspec-native): the routes of every resource, the edge every request passes
(token, permission, strict body, access log, audit), problem+json errors, and the OpenAPI document.

Writes never touch state directly: a submit or cancel is an event on the durable JOBS stream, acknowledged by
JetStream before the API answers, so an accepted request is never lost.
"""

from litestar import Litestar
from litestar.datastructures import State
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import YamlRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from chamber.gateway.access_api import ROUTES as ACCESS_ROUTES
from chamber.gateway.dashboard import ROUTES as DASHBOARD_ROUTES
from chamber.gateway.fleet_api import ROUTES as FLEET_ROUTES
from chamber.gateway.health_api import ROUTES as HEALTH_ROUTES
from chamber.gateway.http_edge import admit, edge_middleware
from chamber.gateway.jobs_api import ROUTES as JOB_ROUTES
from chamber.gateway.logs_api import ROUTES as LOGS_ROUTES
from chamber.gateway.problems import EXCEPTION_HANDLERS
from chamber.gateway.quota_api import ROUTES as QUOTA_ROUTES
from chamber.gateway.state import GatewayState
from chamber.gateway.stream_api import ROUTES as STREAM_ROUTES

MAX_BODY_BYTES = 1024 * 1024
API_VERSION = "1.0.0"


def create_app(gateway: GatewayState) -> Litestar:
    return Litestar(
        route_handlers=[
            *JOB_ROUTES,
            *LOGS_ROUTES,
            *FLEET_ROUTES,
            *QUOTA_ROUTES,
            *HEALTH_ROUTES,
            *ACCESS_ROUTES,
            *STREAM_ROUTES,
            *DASHBOARD_ROUTES,
        ],
        state=State({"gateway": gateway}),
        logging_config=None,  # the service's own logging (structlog) is configured once, at start; not a second one
        middleware=[DefineMiddleware(edge_middleware(gateway))],
        before_request=admit,
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=MAX_BODY_BYTES,
        openapi_config=OpenAPIConfig(
            title="Chamber",
            version=API_VERSION,
            description="Chamber's API: jobs, the fleet, teams and quotas, GPU health, tokens and the audit trail. "
            "Every /v1 call needs `Authorization: Bearer <token>`; errors are application/problem+json (RFC 9457).",
            path="/schema",
            render_plugins=[YamlRenderPlugin()],
            components=Components(
                security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer", description="An API token")}
            ),
            security=[{"bearer": []}],
        ),
        on_startup=[gateway.start],
        on_shutdown=[gateway.stop],
    )
