"""One request's way through the router: wait for a slot, stream, and move to another backend when
its backend fails (re-routed, or migrated mid-stream) or the router hands it over."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, AsyncIterator

from onebit.backends.base import BackendError
from onebit.protocol import GenerateRequest, StepDelta, check_request
from onebit.router.migration import Progress, settle, wait_until_serviceable
from onebit.router.slots import Lease, Ticket

if TYPE_CHECKING:
    from onebit.router.router import Router

log = logging.getLogger(__name__)


class RoutedStream:
    """Streams one request from the backend its ticket lands on, moving it when that backend fails.

    If the backend fails (its worker died, a peer refused the connection or broke the stream, ...)
    the slot is released and the request goes back to the *front* of the router's queue, up to
    `max_attempts` backends in all. Before anything was streamed it is sent again as it was;
    after, it is migrated (`onebit.router.migration`): it continues from its prompt plus the
    tokens already streamed, and the client's stream goes on without a gap or a repeat. While
    no backend is up (the only one is restarting) a migrating request waits for it up to
    `migrate_wait` s. A request that cannot move (out of attempts, or its tokens' ids unknown)
    fails: the BackendError propagates, so the client sees an error, never a clean end.
    The request is validated first (the shared validation, without a vocabulary); input a
    backend rejects (InvalidRequest, ContextOverflow: not BackendErrors) is never retried.

    The router may also hand a streaming request to another backend (`move_to`, see
    `onebit.router.handover`): it leaves its backend after the next delta and migrates.
    With `--priority-preempt` the router may ask the stream to yield its slot to a more urgent request of
    its line (`onebit.router.preemption`): it leaves after the next delta, waits again at the front of its
    line, and continues as a migration does.

    `backend` names the backend serving the request now (None until it has a slot).
    """

    def __init__(self, router: "Router", ticket: "Ticket", request: GenerateRequest, max_attempts: int = 3,
                 migrate_wait: float = 120.0):
        self._router = router
        self._ticket = ticket
        self.request = request
        self.max_attempts = max_attempts
        self.migrate_wait = migrate_wait
        self.backend: str | None = None
        self.attempts = 0  # backends tried because one failed (hand-overs not counted)
        self.handed_over = 0
        self._progress = Progress(request)
        self._next: Lease | None = None  # a slot the router handed this stream to move to

    @property
    def can_move(self) -> bool:
        """Whether the stream can be handed to another backend now."""
        return self._next is None and self._progress.can_continue and bool(self._progress.token_ids)

    @property
    def can_yield(self) -> bool:
        """Whether the stream can give its slot to a more urgent request and continue later."""
        return self._next is None and self._progress.can_continue

    def move_to(self, lease: Lease) -> None:
        """Continue on `lease`'s backend after the next delta (the router's hand-over)."""
        self._next = lease

    async def deltas(self) -> AsyncIterator[StepDelta]:
        """The request's deltas, ending with its finished one; every slot taken is released once.
        The user's service (the prompt once, then every token streamed) is charged to the router's
        fair line."""
        ticket = self._ticket
        progress = self._progress
        handover = self._router.handover
        preemption = self._router.preemption
        user = self.request.user
        users = self._router.users
        users.bind(self.request.request_id, user)
        moving = preempted = False
        started, charged = False, 0
        try:
            check_request(self.request.prompt_token_ids, self.request.params)
            while True:
                lease = await ticket.wait()
                self.backend = lease.backend.name
                route = lease.route
                request = self.request
                if moving:  # what is left of it, in the form this backend takes
                    request = progress.continuation(lease.backend.kind, self._router.decode)
                    if isinstance(request, StepDelta):  # the last backend died after the last token
                        yield request
                        return
                self.attempts += 1
                if handover is not None:
                    handover.track(self, self._router.routes.index(route))
                if preemption is not None:
                    preemption.track(self)
                try:
                    async with contextlib.aclosing(lease.backend.generate(request)) as stream:
                        async for delta in stream:
                            delta = progress.add(delta)
                            if not started:
                                started = True
                                self._router.charge(user, len(self.request.prompt_token_ids))
                            # Service counts the tokens streamed (the final count, for a peer that sends text only).
                            n = len(delta.token_ids)
                            if delta.finished:
                                route.completed += 1
                                n = max(n, delta.num_output_tokens - charged)
                            charged += n
                            self._router.charge(user, n)
                            yield delta
                            if handover is not None and self._next is None and not delta.finished:
                                handover.offer()  # a primary slot may have freed before this stream could move
                            if self._next is not None and not delta.finished:
                                break  # leaving the stream aborts the request on this backend
                            if (preemption is not None and self in preemption.yielding and not delta.finished
                                    and preemption.pass_slot(self, lease)):
                                preempted = True
                                break
                    if preempted:  # wait again at the front of its line; continue from what was sent
                        preempted, moving = False, True
                        self.attempts -= 1
                        ticket.close()
                        preemption.untrack(self)  # before it waits: it is no longer running
                        ticket = self._router.ticket(front=True, user=user, priority=self.request.priority)
                        continue
                    if self._next is None:
                        return
                    ticket.close()
                    ticket = Ticket.holding(self._next)
                    self._next = None
                    self.attempts -= 1
                    self.handed_over += 1
                    handover.moves += 1
                    moving = True
                    continue
                except BackendError as error:
                    if self.attempts >= self.max_attempts or not progress.can_continue:
                        route.failed += 1
                        raise
                    ticket.close()
                    await settle(lease.backend)
                    streamed = len(progress.token_ids)
                    log.warning("request %s: backend %s failed after %d tokens (%s); %s", self.request.request_id,
                                self.backend, streamed, error, "migrating" if streamed else "re-routing")
                    if streamed and not await wait_until_serviceable(self._router, self.migrate_wait):
                        raise
                finally:
                    if handover is not None:
                        handover.untrack(self)
                    if preemption is not None:
                        preemption.untrack(self)
                moving = True
                if self._next is not None:  # a hand-over offered as this backend failed: take it
                    ticket, self._next = Ticket.holding(self._next), None
                else:
                    ticket = self._router.ticket(front=True, user=user, priority=self.request.priority)
        finally:
            users.unbind(self.request.request_id)
            ticket.close()
            if self._next is not None:  # offered as the request finished
                self._next.release()
                self._next = None
