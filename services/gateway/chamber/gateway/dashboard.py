"""The web dashboard: one page and its assets, shipped inside the wheel (no CDN), served at `/` and `/ui/`.

The page is a client of the public API (the same token, the same endpoints, the live stream); it has no private
back door, so what it shows is what the API tells anyone with a token.
"""

from pathlib import Path

from litestar import Response, get
from litestar.static_files import create_static_files_router
from litestar.types import ControllerRouterHandler

STATIC = Path(__file__).parent / "static"


@get("/", include_in_schema=False)
async def index() -> Response[bytes]:
    return Response(content=(STATIC / "index.html").read_bytes(), media_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "no-cache"})  # fmt: skip


ROUTES: list[ControllerRouterHandler] = [
    index,
    create_static_files_router(path="/ui", directories=[STATIC], include_in_schema=False),
]
