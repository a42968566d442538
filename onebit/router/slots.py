"""The router's bookkeeping objects: a backend with its slot limit, a reserved slot, a place in line."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from onebit.backends.base import Backend

if TYPE_CHECKING:
    from onebit.router.router import Router


@dataclass
class Route:
    """A backend with the number of requests the router lets it hold at once."""

    backend: Backend
    limit: int
    in_flight: int = 0
    served: int = 0  # slots handed out (a re-routed request counts on each backend it reached)
    completed: int = 0  # requests that finished cleanly here
    failed: int = 0  # requests that ended here with a backend error
    preempted: int = 0  # requests that gave their slot here to a more urgent one (`onebit.router.preemption`)

    @property
    def name(self) -> str:
        """The backend's name."""
        return self.backend.name


class Lease:
    """One reserved slot on one backend; released exactly once."""

    def __init__(self, router: "Router", route: Route, user: str | None = None):
        self._router = router
        self.route = route
        self.user = user
        self.released = False

    @property
    def backend(self) -> Backend:
        """The backend this lease holds a slot on."""
        return self.route.backend

    def release(self) -> None:
        """Give the slot back (a second call does nothing)."""
        if not self.released:
            self.released = True
            self._router._release(self.route, self.user)


class Ticket:
    """A place in line for a slot, taken synchronously; `wait()` yields the Lease.

    `close()` releases the lease or leaves the queue, whichever applies, exactly once.
    Dropping an unclosed ticket closes it, so a response that never starts leaks nothing.
    """

    def __init__(self, future: asyncio.Future, on_leave: Callable[[asyncio.Future], None] | None = None):
        self._future = future
        self._on_leave = on_leave  # takes the future out of the router's line
        self._closed = False

    @classmethod
    def holding(cls, lease: Lease) -> "Ticket":
        """A ticket for a slot already reserved (a hand-over)."""
        future = asyncio.get_running_loop().create_future()
        future.set_result(lease)
        return cls(future)

    async def wait(self) -> Lease:
        """The reserved slot, once it is ours."""
        return await self._future

    @property
    def done(self) -> bool:
        """True once the ticket holds a slot (or failed, or was closed): it no longer waits."""
        return self._future.done()

    @property
    def future(self) -> asyncio.Future:
        """What `wait()` awaits, for `asyncio.wait` over several tickets (do not await it to take the lease)."""
        return self._future

    def hand_over(self) -> None:
        """The caller now owns the lease it got from `wait()` and releases it itself."""
        self._closed = True

    def close(self) -> None:
        """Release the slot, or give up the place in line."""
        if self._closed:
            return
        self._closed = True
        future = self._future
        if future.done() and not future.cancelled():
            if future.exception() is None:
                future.result().release()
            return
        future.cancel()  # still waiting, or its waiter was cancelled: leave the line
        if self._on_leave is not None:
            self._on_leave(future)

    def __del__(self):
        if not self._closed:
            try:
                self.close()
            except Exception:  # interpreter or loop shutting down: nothing left to release to
                pass
