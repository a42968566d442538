"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class APIError(Exception):
    """An error the API answers with; `extra` fields join the error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, **extra):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.extra = extra

    def body(self) -> dict:
        """The JSON body of the error response (also the payload of an SSE error event)."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        error.update(self.extra)
        return {"error": error}

    def response(self) -> JSONResponse:
        """The error as an HTTP response."""
        return JSONResponse(self.body(), status_code=self.status)


def invalid_request(message: str, param: str | None = None) -> APIError:
    """400 invalid_request_error naming the offending field."""
    return APIError(400, message, param=param, code="invalid_value")


def context_overflow(n_prompt_tokens: int, n_ctx: int) -> APIError:
    """400 exceed_context_size_error: the prompt does not fit the context."""
    return APIError(400, f"the request exceeds the available context size ({n_prompt_tokens} prompt tokens, "
                         f"context {n_ctx}); shorten the prompt", type="exceed_context_size_error",
                    param="messages", code="context_length_exceeded",
                    n_prompt_tokens=n_prompt_tokens, n_ctx=n_ctx)


def unavailable(message: str, code: str = "unavailable") -> APIError:
    """503: loading, queue full, or no backend."""
    return APIError(503, message, type="unavailable_error", code=code)


def internal_error(message: str = "internal server error") -> APIError:
    """500: something failed on our side."""
    return APIError(500, message, type="server_error", code="internal_error")


_STATUS_TYPES = {
    401: ("authentication_error", "invalid_api_key"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}


_UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "TextPart"})


def _is_field(part) -> bool:
    """False for pydantic's union-member tags ('str', 'list[int]', ...) inside an error location."""
    if isinstance(part, int):
        return True
    return part not in _UNION_TAGS and "[" not in part and not part.startswith("function-")


def _loc_to_param(loc) -> str | None:
    parts = [str(p) for p in loc[1:] if _is_field(p)] if loc and loc[0] == "body" else []
    return ".".join(parts) or None


def _validation_message(error: dict) -> str:
    param = _loc_to_param(error.get("loc", ()))
    message = error.get("msg", "invalid value")
    if error.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    return f"{param}: {message}" if param else message


async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = None if first.get("type") == "json_invalid" else _loc_to_param(first.get("loc", ()))
    return invalid_request(_validation_message(first), param).response()


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    type_, code = _STATUS_TYPES.get(exc.status_code, ("invalid_request_error", None))
    if exc.status_code >= 500:
        type_ = "server_error"
    message = exc.detail if isinstance(exc.detail, str) else "error"
    if exc.status_code == 404:
        message = f"unknown route: {request.method} {request.url.path}"
    return APIError(exc.status_code, message, type=type_, code=code).response()


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return internal_error(f"internal error: {type(exc).__name__}").response()


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app returns OpenAI-shaped."""
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
