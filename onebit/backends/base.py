"""The interface every backend implements, so the router never knows which kind it drives."""

from __future__ import annotations

import abc
import asyncio
from typing import AsyncIterator, Callable

from onebit.engine.outputs import EngineStats, SlotInfo  # re-exported for backends
from onebit.protocol import GenerateRequest, InternalError, StepDelta

__all__ = ["Backend", "BackendError", "EngineStats", "GenerateRequest", "SlotInfo", "StatefulBackend", "StepDelta",
           "coalesced"]


class BackendError(InternalError):
    """A backend failed or went away while serving a request (the router may try another one
    if nothing was streamed yet). Bad input is never a BackendError: backends raise the
    shared InvalidRequest / ContextOverflow for it, which the router never retries."""


async def coalesced(stream: asyncio.Queue) -> AsyncIterator[StepDelta]:
    """Yield a request's deltas from its queue (StepDeltas, or an exception to raise) until the
    finished one. A consumer that fell behind gets the queued steps merged into one delta, so
    under load the front sends fewer, larger events instead of falling further behind."""
    while True:
        item = await stream.get()
        while isinstance(item, StepDelta) and not item.finished and not stream.empty():
            later = stream.get_nowait()
            if isinstance(later, BaseException):
                yield item
                item = later
                break
            item = item.then(later)
        if isinstance(item, BaseException):
            raise item
        yield item
        if item.finished:
            return


class Backend(abc.ABC):
    """An async generation service with a fixed number of slots.

    Lifecycle: `await start()` (loads the model; `state` goes "loading" -> "ready"),
    then any number of concurrent `generate()` streams, then `await stop()`.
    `generate` yields StepDeltas; the last has finished=True. If the backend dies
    mid-stream, `generate` raises BackendError: a failed stream never ends cleanly; input it
    refuses raises the protocol's InvalidRequest (or ContextOverflow).
    Breaking out of (or cancelling) a `generate` iteration aborts the request.

    Health is the backend's own business: when its process dies or stops answering it
    sets `state` to "down" and calls `on_state_change()` (set by the router), and a
    later `start()` must bring it back. The router restarts down backends with backoff.
    """

    name: str
    kind: str
    capacity: int
    on_state_change: Callable[[], None] | None = None

    @property
    @abc.abstractmethod
    def state(self) -> str:
        """One of "loading", "ready", "down", "stopped"."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the backend and return once it is ready to serve."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop serving; in-flight streams end with BackendError."""

    @abc.abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[StepDelta]:
        """Stream the request's deltas until its finished delta."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a request early; its slot and KV blocks are freed."""

    @abc.abstractmethod
    def slots(self) -> list[SlotInfo]:
        """The backend's slots as last reported."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """The backend's counters as last reported."""

    def _check_admissible(self, request_id: str, active) -> None:
        """BackendError unless this backend is ready and `request_id` is not already streaming."""
        if self.state != "ready":
            raise BackendError(f"backend {self.name} is {self.state}")
        if request_id in active:
            raise BackendError(f"duplicate request id {request_id}")

    def info(self) -> dict:
        """What /props shows about this backend."""
        return {"name": self.name, "kind": self.kind, "capacity": self.capacity, "state": self.state}


class StatefulBackend(Backend):
    """A backend that keeps its state in `_state` and calls `on_state_change()` on every change."""

    _state: str = "stopped"

    @property
    def state(self) -> str:
        """One of "loading", "ready", "down", "stopped"."""
        return self._state

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            if self.on_state_change is not None:
                self.on_state_change()
