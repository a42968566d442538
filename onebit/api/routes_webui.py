"""The web page at `/`: static files shipped in the package (`onebit/webui/`), no build step.

The page itself is public, like /health: it holds no data. Everything it shows comes from the
API routes (/v1/models, /v1/chat/completions, /slots, /props, /metrics, /queue), which need the
API key when the server has one; the page asks for it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from onebit.protocol.errors import NotFound

WEBUI_DIR = Path(__file__).resolve().parent.parent / "webui"
WEBUI_PREFIX = "/webui/"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# The page changes with the package; a browser revalidates instead of running an old script.
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> FileResponse:
    path = WEBUI_DIR / name
    suffix = path.suffix
    # Only plain names of files shipped in the folder: no sub-paths, nothing else on disk.
    if "/" in name or name.startswith(".") or suffix not in _TYPES or not path.is_file():
        raise NotFound(f"no such file: {name}")
    return FileResponse(path, media_type=_TYPES[suffix], headers=_HEADERS)


@router.get("/")
async def index() -> FileResponse:
    """The page: chat with the model, and the live view of slots, queue and users."""
    return _file("index.html")


@router.get(WEBUI_PREFIX + "{name}")
async def asset(name: str) -> FileResponse:
    """A script or style sheet of the page."""
    return _file(name)
