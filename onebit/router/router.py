"""Choose a backend and reserve one of its slots in one atomic step, or wait in a fair line.

Everything that touches the counters runs on the event loop thread without an
`await` between the check and the claim, so a burst of requests can never pile onto
one slot (the race the seed's first router had).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator

from onebit.backends.base import Backend
from onebit.protocol import GenerateRequest, StepDelta
from onebit.protocol.fair_queue import FairQueue
from onebit.router.errors import NoBackendAvailable, QueueFull, RouterClosed
from onebit.router.handover import HandOver
from onebit.router.preemption import Preemption
from onebit.router.routed_stream import RoutedStream
from onebit.router.slots import Lease, Route, Ticket
from onebit.router.supervisor import Supervisor
from onebit.router.user_book import UserBook

log = logging.getLogger(__name__)


class Router:
    """Spreads requests over backends in priority order, with a bounded waiting line.

    A request goes to the first backend (in list order) that is ready and holds
    fewer than its limit; when all are full it waits, at most `max_queue` requests
    in all (beyond it: QueueFull). The line is shared fairly between users (least
    tokens served first, see `onebit.protocol.fair_queue`; `fair=False`: one FIFO line).
    With one backend this is a plain admission gate; with a primary and a secondary it is
    issue 4's adaptive mode.

    `overflow` says where requests go once the primary's limit is reached:
    "spill" (default) keeps filling the primary to its limit and sends only the excess on, right
    for backends on separate hardware; "switch" sends every new request to the overflow
    backends while the total load is at or above the primary's limit (the primary takes one
    only when they are full), so backends that share one GPU do not both run steps at once
    under steady load: the primary drains and the big-batch backend carries it all.

    A backend that goes down is restarted by the `supervisor` (pass None for none);
    a request it failed is re-routed, or migrated if it had streamed (`stream()`).
    `hand_over` (with "spill"): when the load falls back to the primary's limit, requests streaming
    on the overflow backends move to the primary's free slots (`onebit.router.handover`).
    `priority_preempt`: a waiting request takes the slot of a running one of its own line with a larger
    priority value, which continues later (`onebit.router.preemption`).
    """

    def __init__(self, backends: list[Backend], limits: list[int] | None = None, max_queue: int = 1024,
                 supervisor: Supervisor | None | bool = True, max_attempts: int = 3, overflow: str = "spill",
                 fair: bool = True, hand_over: bool = False, priority_preempt: bool = False):
        if not backends:
            raise ValueError("the router needs at least one backend")
        if overflow not in ("spill", "switch"):
            raise ValueError("overflow must be 'spill' or 'switch'")
        self.overflow = overflow
        limits = limits or [b.capacity for b in backends]
        if len(limits) != len(backends) or any(n < 1 for n in limits):
            raise ValueError("one limit >= 1 per backend")
        self.routes = [Route(b, n) for b, n in zip(backends, limits)]
        self.max_queue = max_queue
        self.max_attempts = max_attempts
        self.supervisor = Supervisor() if supervisor is True else (supervisor or None)
        self.fair = fair
        self._waiters: FairQueue[asyncio.Future] = FairQueue(fair)
        self.users = UserBook()
        self._closed = False
        self._started = False
        self.decode = None  # (token ids, skip_special_tokens) -> text, set once the tokenizer loads (migration)
        for route in self.routes:
            route.backend.on_state_change = self._on_backend_state_change
        self.handover = HandOver(self) if hand_over and overflow == "spill" and len(self.routes) > 1 else None
        self.preemption = Preemption(self) if priority_preempt else None

    # ---- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Start every backend concurrently; raise the first failure only if none started.

        Backends that failed while another started are left to the supervisor.
        """
        results = await asyncio.gather(*(r.backend.start() for r in self.routes), return_exceptions=True)
        errors = [(r, e) for r, e in zip(self.routes, results) if isinstance(e, BaseException)]
        if len(errors) == len(self.routes):
            raise errors[0][1]
        for route, error in errors:
            log.error("backend %s failed to start (%s); serving without it for now", route.name, error)
        self._started = True
        self._on_backend_state_change()

    async def stop(self) -> None:
        """Refuse new requests, fail waiting ones, stop every backend, and log what each served."""
        if self._closed:
            return
        self._closed = True
        self._fail_waiters(RouterClosed("server is shutting down"))
        if self.supervisor is not None:
            await self.supervisor.close()
        await asyncio.gather(*(r.backend.stop() for r in self.routes), return_exceptions=True)
        for route in self.routes:
            log.info("backend %s (%s) took %d requests: %d completed, %d failed", route.name, route.backend.kind,
                     route.served, route.completed, route.failed)

    @property
    def state(self) -> str:
        """"ready" when any backend serves, else "loading", "stopped" or "down"."""
        states = [r.backend.state for r in self.routes]
        if self._closed:
            return "stopped"
        for state in ("ready", "loading"):
            if state in states:
                return state
        return "down"

    @property
    def queue_size(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for f in self._waiters if not f.done())

    @property
    def in_flight(self) -> int:
        """Slots reserved over all backends."""
        return sum(r.in_flight for r in self.routes)

    # ---- choose and reserve ----------------------------------------------

    def _free_route(self) -> Route | None:
        """The route a new request goes to now; None when all are full (claim it before any `await`)."""
        order = self.routes
        if self.overflow == "switch" and self.in_flight >= self.routes[0].limit:
            order = self.routes[1:] + self.routes[:1]
        for route in order:
            if route.in_flight < route.limit and route.backend.state == "ready":
                return route
        return None

    def claim(self, route: Route, user: str | None) -> Lease:
        """Reserve one slot on `route` for `user` now, counting it as served there.

        The caller has checked, with no `await` since, that the route has a free slot: the router
        itself for a request it picked, the hand-over for a stream it moves to the primary.
        """
        route.in_flight += 1
        route.served += 1
        return self._lease(route, user)

    def _release(self, route: Route, user: str | None = None) -> None:
        self._waiters.ended(user)
        self.users.ended(user)
        route.in_flight -= 1
        if route.in_flight < 0:  # a bug, never a client's doing: fail loudly
            route.in_flight = 0
            raise AssertionError(f"backend {route.name}: slot released twice")
        self._dispatch()
        if self.handover is not None:
            self.handover.offer()

    def _dispatch(self) -> None:
        """Hand free slots to waiters, the least-served user's first."""
        while self._waiters:
            if self._waiters.peek().done():  # cancelled while waiting (Ticket.close removes it too)
                self._leave(self._waiters.peek())
                continue
            route = self._free_route()
            if route is None:
                return
            future = self._waiters.peek()
            user = self._waiters.user_of(future)
            self._leave(future)
            future.set_result(self.claim(route, user))

    def pass_slot(self, lease: Lease, future: asyncio.Future) -> None:
        """Give the slot `lease` holds straight to the waiting `future` (a preemption), without freeing it
        in between, so nobody else can take it; `lease` counts as released."""
        user = self._waiters.user_of(future)
        self._leave(future)
        lease.released = True
        self._waiters.ended(lease.user)
        self.users.ended(lease.user)
        future.set_result(self._lease(lease.route, user))

    def _lease(self, route: Route, user: str | None) -> Lease:
        self._waiters.started(user)
        self.users.started(user)
        return Lease(self, route, user)

    def _leave(self, future: asyncio.Future) -> None:
        """Take a future out of the line (it got a slot, or gave up its place)."""
        user = self._waiters.user_of(future)
        if self._waiters.remove(future):
            self.users.left_queue(user)

    def charge(self, user: str | None, tokens: int) -> None:
        """Count `tokens` served to `user`, for the fair share between users."""
        self._waiters.charge(user, tokens)
        self.users.charge(user, tokens)

    def line_of(self, user: str | None) -> str:
        """The waiting line `user`'s requests join: their own under fair share, one shared line without."""
        return self._waiters.line_of(user)

    def waiting_in(self, line: str) -> list[tuple[int, asyncio.Future]]:
        """(priority, future) of the requests still waiting in `line`, in the order they will be served."""
        return [(p, f) for p, f in self._waiters.waiting_in(line) if not f.done()]

    def position(self, ticket: Ticket) -> int:
        """The ticket's estimated place in line (0 once it holds a slot)."""
        return self._waiters.position(ticket.future)

    def _serviceable(self) -> bool:
        return any(r.backend.state in ("ready", "loading") for r in self.routes)

    def serviceable(self) -> bool:
        """True while some backend is ready or loading (a new ticket would not fail at once)."""
        return not self._closed and self._serviceable()

    @property
    def closed(self) -> bool:
        """True once `stop()` began."""
        return self._closed

    def ticket(self, front: bool = False, user: str | None = None, priority: int = 0) -> Ticket:
        """Claim a free slot now, or join the line (in `user`'s place, by `priority` within it), without awaiting.

        Raises RouterClosed, NoBackendAvailable or QueueFull at once, so an API can
        answer 503 before it starts a streaming response. `front=True` is for a
        request being re-routed: it already waited its turn, so it goes first and
        is not bounded by `max_queue`.
        """
        if self._closed:
            raise RouterClosed("server is shutting down")
        if not self._serviceable():
            raise NoBackendAvailable("no backend is available")
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        if front or not self.queue_size:
            route = self._free_route()
            if route is not None:
                future.set_result(self.claim(route, user))
                return Ticket(future, self._leave)
        if not front and self.queue_size >= self.max_queue:
            raise QueueFull(f"all slots are busy and {self.max_queue} requests are waiting")
        self._waiters.push(future, user, priority, front=front)
        self.users.joined_queue(user)
        if self.preemption is not None:
            self.preemption.review(self._waiters.line_of(user))
        return Ticket(future, self._leave)

    def stream(self, ticket: Ticket, request: GenerateRequest) -> RoutedStream:
        """The request's deltas from whichever backend serves it, re-routed on an early failure."""
        return RoutedStream(self, ticket, request, self.max_attempts)

    async def acquire(self) -> Lease:
        """Reserve a slot, waiting in line when all are taken."""
        ticket = self.ticket()
        try:
            lease = await ticket.wait()
        except BaseException:
            ticket.close()
            raise
        ticket.hand_over()
        return lease

    @contextlib.asynccontextmanager
    async def reserve(self) -> AsyncIterator[Lease]:
        """`async with router.reserve() as lease:` holds one slot for the block's duration."""
        ticket = self.ticket()
        try:
            yield await ticket.wait()
        finally:
            ticket.close()

    async def generate(self, request: GenerateRequest) -> AsyncIterator[StepDelta]:
        """Reserve a slot and stream the request's deltas (re-routed if its backend fails first)."""
        async with contextlib.aclosing(self.stream(self.ticket(), request).deltas()) as stream:
            async for delta in stream:
                yield delta

    # ---- health ------------------------------------------------------------

    def _fail_waiters(self, error: Exception) -> None:
        while self._waiters:
            future = self._waiters.peek()
            self._leave(future)
            if not future.done():
                future.set_exception(error)

    def _on_backend_state_change(self) -> None:
        """A backend changed state: have it restarted if down; wake waiters, or fail them if nothing can serve."""
        if self._started and not self._closed and self.supervisor is not None:
            self.supervisor.check([r.backend for r in self.routes])
        if not self._serviceable():
            self._fail_waiters(NoBackendAvailable("no backend is available"))
        else:
            self._dispatch()
            if self.handover is not None and self._started:
                self.handover.offer()

    def backends_info(self) -> list[dict]:
        """Per-backend facts for /props: kind, capacity, in-flight, state, ..."""
        out = []
        for route in self.routes:
            info = dict(route.backend.info())
            info.update(limit=route.limit, in_flight=route.in_flight, served=route.served, preempted=route.preempted)
            out.append(info)
        return out

    def slots(self) -> list[dict]:
        """Every slot of every backend, in /slots shape."""
        out = []
        for route in self.routes:
            for slot in route.backend.slots():
                entry = slot.to_json()
                entry["user"] = self.users.user_of_request(entry.get("id_task"))
                out.append(entry)
        return out
