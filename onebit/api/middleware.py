"""ASGI middlewares: API key check and request body size limit (pure ASGI, so streams stay cheap)."""

from __future__ import annotations

import json

from fastapi import HTTPException

from onebit.api.auth import KeyInfo, match_key
from onebit.api.errors import TooLarge, Unauthorized, error_body, status_of
from onebit.protocol.errors import RequestError

PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
                          "/"})
PUBLIC_PREFIXES = ("/webui/",)  # the web page's static files: no data in them (api/routes_webui.py)


def _public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


async def _send_error(send, error: RequestError) -> None:
    body = json.dumps(error_body(error)).encode()
    await send({"type": "http.response.start", "status": status_of(error),
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _drain(receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


class APIKeyMiddleware:
    """Answers 401 unless `Authorization: Bearer KEY` (or `x-api-key: KEY`) is one of `keys`; a known
    key's KeyInfo goes into the request's state as `api_key` (whose user it is, its limits)."""

    def __init__(self, app, keys: dict[str, KeyInfo]):
        self.app = app
        self._keys = {key.encode(): info for key, info in keys.items()}

    async def __call__(self, scope, receive, send):
        """ASGI entry."""
        if scope["type"] != "http" or _public(scope["path"]):
            return await self.app(scope, receive, send)
        info = match_key(self._keys, scope["headers"])
        if info is not None:
            scope.setdefault("state", {})["api_key"] = info
            return await self.app(scope, receive, send)
        await _drain(receive)
        await _send_error(send, Unauthorized("invalid or missing API key"))


class BodyLimitMiddleware:
    """Answers 413 when the request body is larger than `max_bytes`."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> TooLarge:
        return TooLarge(f"request body larger than {self.max_bytes} bytes")

    async def __call__(self, scope, receive, send):
        """ASGI entry."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _drain(receive)  # a client still writing its body would see a broken pipe
                return await _send_error(send, self._too_large())
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI re-raises HTTPException from body parsing; our handler shapes it.
                    raise HTTPException(413, f"request body larger than {self.max_bytes} bytes")
            return message

        await self.app(scope, counting_receive, send)
