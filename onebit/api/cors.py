"""Cross-origin requests (`--cors-origins`): browsers on the listed origins may call the API.

Only a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here, before
the API key is checked: browsers never send credentials on a preflight, and the answer carries no
data. Every real request still passes the key check; its answer (a 401 included, so a page can read
it) gets the CORS headers when its origin is allowed. With no origins given, nothing is added.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

PREFLIGHT_MAX_AGE_S = 600


def parse_origins(text: str | None) -> list[str]:
    """`--cors-origins` as a list: comma-separated origins, or `*` for any."""
    if not text:
        return []
    return [origin.strip().rstrip("/") for origin in text.split(",") if origin.strip()]


def add_cors(app: FastAPI, origins: list[str] | None) -> None:
    """Answer preflights and label answers for these origins (add it last: it must be outermost)."""
    if not origins:
        return
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST", "OPTIONS"],
                       allow_headers=["*"],
                       allow_credentials=False, max_age=PREFLIGHT_MAX_AGE_S)
