"""Why the router could not place a request (the API maps each to a 503)."""

from __future__ import annotations


class RouterError(RuntimeError):
    """Base class: the router could not hand out a backend slot."""


class QueueFull(RouterError):
    """Every slot is taken and the waiting queue holds `max_queue` requests already."""


class NoBackendAvailable(RouterError):
    """No backend is loading or ready: nothing can ever serve the request."""


class RouterClosed(RouterError):
    """The server is shutting down and accepts no new requests."""
