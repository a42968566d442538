"""One request's way through the router: wait for a slot, stream, and re-route an early failure."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, AsyncIterator

from onebit.backends.base import BackendError
from onebit.protocol import GenerateRequest, StepDelta, check_request
from onebit.router.migration import Progress, wait_until_serviceable

if TYPE_CHECKING:
    from onebit.router.router import Router, Ticket

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
        self.attempts = 0

    async def deltas(self) -> AsyncIterator[StepDelta]:
        """The request's deltas, ending with its finished one; every slot taken is released once."""
        ticket = self._ticket
        progress = Progress(self.request)
        moving = False
        try:
            check_request(self.request.prompt_token_ids, self.request.params)
            while True:
                lease = await ticket.wait()
                self.attempts += 1
                self.backend = lease.backend.name
                route = lease.route
                request = self.request
                if moving:  # what is left of it, in the form this backend takes
                    request = progress.continuation(lease.backend.kind, self._router.decode)
                    if isinstance(request, StepDelta):  # the last backend died after the last token
                        yield request
                        return
                try:
                    async with contextlib.aclosing(lease.backend.generate(request)) as stream:
                        async for delta in stream:
                            delta = progress.add(delta)
                            if delta.finished:
                                route.completed += 1
                            yield delta
                    return
                except BackendError as error:
                    if self.attempts >= self.max_attempts or not progress.can_continue:
                        route.failed += 1
                        raise
                    ticket.close()
                    streamed = len(progress.token_ids)
                    log.warning("request %s: backend %s failed after %d tokens (%s); %s", self.request.request_id,
                                self.backend, streamed, error, "migrating" if streamed else "re-routing")
                    if streamed and not await wait_until_serviceable(self._router, self.migrate_wait):
                        raise
                moving = True
                ticket = self._router.ticket(front=True)
        finally:
            ticket.close()
