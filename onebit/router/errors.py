"""Why the router could not place a request: the shared failure kinds (the API maps each to a 503)."""

from __future__ import annotations

from onebit.protocol.errors import Overloaded, RequestError, Unavailable


class RouterError(RequestError):
    """Base class: the router could not hand out a backend slot."""


class QueueFull(RouterError, Overloaded):
    """Every slot is taken and the waiting queue holds `max_queue` requests already."""

    def __init__(self, message: str):
        super().__init__(message, code="queue_full")


class NoBackendAvailable(RouterError, Unavailable):
    """No backend is loading or ready: nothing can ever serve the request."""


class RouterClosed(RouterError, Unavailable):
    """The server is shutting down and accepts no new requests."""
