"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code", ...}}` with the right status.

Every failure is one of the shared exception types (`onebit.protocol.errors`, plus the four
HTTP-only kinds below); `ERRORS` is the one table that maps each kind to its HTTP status,
error type and default code. The type is OpenAI's, except context overflow, which keeps
llama-server's `exceed_context_size_error` (with `n_prompt_tokens` and `n_ctx` beside it) and
OpenAI's `context_length_exceeded` as its code.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from onebit.protocol.errors import InternalError, InvalidRequest, NotFound, RequestError

log = logging.getLogger(__name__)


class Unauthorized(RequestError):
    """No valid API key."""

    kind = "unauthorized"


class MethodNotAllowed(RequestError):
    """The route exists, the method does not."""

    kind = "method_not_allowed"


class TooLarge(RequestError):
    """The request body is over the size limit."""

    kind = "too_large"


class RateLimited(RequestError):
    """Over one of the key's limits; `retry_after` seconds is when trying again can succeed."""

    kind = "rate_limited"

    def __init__(self, message: str, retry_after: int, code: str | None = None):
        super().__init__(message, None, code)
        self.retry_after = max(1, int(retry_after))


# kind -> (HTTP status, error type, default code)
ERRORS: dict[str, tuple[int, str, str | None]] = {
    "invalid_request": (400, "invalid_request_error", "invalid_value"),
    "context_overflow": (400, "exceed_context_size_error", "context_length_exceeded"),
    "unauthorized": (401, "authentication_error", "invalid_api_key"),
    "not_found": (404, "not_found_error", "not_found"),
    "method_not_allowed": (405, "invalid_request_error", "method_not_allowed"),
    "too_large": (413, "invalid_request_error", "request_too_large"),
    "rate_limited": (429, "rate_limit_error", "rate_limit_exceeded"),
    "cancelled": (499, "cancelled_error", "cancelled"),  # nginx's "client closed request": nobody reads it
    "internal": (500, "server_error", "internal_error"),
    "overloaded": (503, "unavailable_error", "queue_full"),
    "unavailable": (503, "unavailable_error", "unavailable"),
}


def status_of(error: RequestError) -> int:
    """The HTTP status of this failure."""
    return ERRORS.get(error.kind, ERRORS["internal"])[0]


def error_body(error: RequestError) -> dict:
    """The JSON body of the error response (also the payload of an SSE error event)."""
    _, type_, code = ERRORS.get(error.kind, ERRORS["internal"])
    body = {"message": error.message, "type": type_, "param": error.param, "code": error.code or code}
    body.update(error.fields())
    return {"error": body}


def as_request_error(error: Exception, what: str) -> RequestError:
    """What a client is told about a failure: `error` itself when it is one of ours; anything else is a
    bug, logged with its traceback as "`what` failed" and told as a plain internal error (call it
    inside the `except` block, where the traceback is still at hand)."""
    if isinstance(error, RequestError):
        return error
    log.exception("%s failed", what)
    return InternalError("internal server error")


def error_response(error: RequestError) -> JSONResponse:
    """The error as an HTTP response (with `Retry-After` when the error says when to retry)."""
    retry_after = getattr(error, "retry_after", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(error_body(error), status_code=status_of(error), headers=headers)


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


async def _on_request_error(request: Request, exc: RequestError) -> JSONResponse:
    return error_response(exc)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {}
    param = None if first.get("type") == "json_invalid" else _loc_to_param(first.get("loc", ()))
    return error_response(InvalidRequest(_validation_message(first), param))


_HTTP_KINDS = {401: Unauthorized, 404: NotFound, 405: MethodNotAllowed, 413: TooLarge}


async def _on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else "error"
    if exc.status_code == 404:
        message = f"unknown route: {request.method} {request.url.path}"
    cls = _HTTP_KINDS.get(exc.status_code)
    if cls is None:  # a status no failure kind of ours produces: keep it, with a type by its class
        type_ = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": None}},
                            status_code=exc.status_code)
    return error_response(cls(message))


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return error_response(InternalError(f"internal error: {type(exc).__name__}"))


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app returns OpenAI-shaped."""
    app.add_exception_handler(RequestError, _on_request_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
