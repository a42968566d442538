"""One exception type per way a request can fail, shared by every layer.

Each is raised where the failure is found (engine, backend, router, API) and travels unchanged
up to the API, which maps its `kind` to an HTTP status and error type in one table
(`onebit/api/errors.py`). Across a process or network boundary an error goes as plain data
(`to_wire`) and comes back as the same type (`from_wire`).
"""

from __future__ import annotations


class RequestError(Exception):
    """Base class: a request failed. `param` names the offending field; `code` overrides the
    table's default error code for this one failure (e.g. "loading", "model_not_found")."""

    kind = "internal"

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def fields(self) -> dict:
        """Extra fields of this kind that join the error object (none by default)."""
        return {}

    def to_wire(self) -> dict:
        """The error as plain data (pickles, JSON-encodes) for `from_wire` on the other side."""
        return {"kind": self.kind, "message": self.message, "param": self.param, "code": self.code,
                **self.fields()}


class InvalidRequest(RequestError, ValueError):
    """The client's input is wrong (a field out of range, an unknown token id, ...): never retried."""

    kind = "invalid_request"


class ContextOverflow(InvalidRequest):
    """The prompt does not fit the context (llama-server's exceed_context_size_error)."""

    kind = "context_overflow"

    def __init__(self, n_prompt_tokens: int, n_ctx: int, message: str | None = None,
                 param: str | None = None, code: str | None = None):
        super().__init__(message or f"the request exceeds the available context size ({n_prompt_tokens} prompt "
                                    f"tokens, context {n_ctx}); shorten the prompt", param, code)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx

    def fields(self) -> dict:
        """The prompt's size and the context's, as llama-server reports them."""
        return {"n_prompt_tokens": self.n_prompt_tokens, "n_ctx": self.n_ctx}


class NotFound(RequestError):
    """The request names something this server does not have (a model, a route)."""

    kind = "not_found"


class Overloaded(RequestError):
    """Every slot is busy and the waiting queue is full: retrying later can help."""

    kind = "overloaded"


class Unavailable(RequestError):
    """No backend can serve now (loading, down, shutting down)."""

    kind = "unavailable"


class Cancelled(RequestError):
    """The request was given up before it finished (its client went away)."""

    kind = "cancelled"


class InternalError(RequestError):
    """Something failed on the server's side (a backend died, a bug)."""

    kind = "internal"


KINDS: dict[str, type[RequestError]] = {cls.kind: cls for cls in (
    InvalidRequest, ContextOverflow, NotFound, Overloaded, Unavailable, Cancelled, InternalError)}


def from_wire(data: dict) -> RequestError:
    """The exception `to_wire` described, of the same type; unknown kinds read as InternalError."""
    cls = KINDS.get(data.get("kind"), InternalError)
    message = str(data.get("message") or cls.__name__)
    param, code = data.get("param"), data.get("code")
    if cls is ContextOverflow:
        try:
            return ContextOverflow(int(data["n_prompt_tokens"]), int(data["n_ctx"]), message, param, code)
        except (KeyError, TypeError, ValueError):  # a peer that left the sizes out
            return InvalidRequest(message, param, code)
    return cls(message, param, code)
