"""One request's way through the router: wait for a slot, stream, and re-route an early failure."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, AsyncIterator

from onebit.backends.base import BackendError
from onebit.protocol import GenerateRequest, StepDelta, check_request

if TYPE_CHECKING:
    from onebit.router.router import Router, Ticket

log = logging.getLogger(__name__)


class RoutedStream:
    """Streams one request from the backend its ticket lands on.

    If that backend fails before the request produced anything (its worker died while
    the request waited in the engine, a peer refused the connection, ...), the slot is
    released and the request goes back to the *front* of the router's queue, up to
    `max_attempts` backends in all. Once a delta has been yielded a failure is final:
    the BackendError propagates, so the client sees an error, never a clean end.
    The request is validated first (the shared validation, without a vocabulary); input a
    backend rejects (InvalidRequest, ContextOverflow: not BackendErrors) is never retried.

    `backend` names the backend serving the request now (None until it has a slot).
    """

    def __init__(self, router: "Router", ticket: "Ticket", request: GenerateRequest, max_attempts: int = 3):
        self._router = router
        self._ticket = ticket
        self.request = request
        self.max_attempts = max_attempts
        self.backend: str | None = None
        self.attempts = 0

    async def deltas(self) -> AsyncIterator[StepDelta]:
        """The request's deltas, ending with its finished one; every slot taken is released once."""
        ticket = self._ticket
        request = self.request
        users = self._router.users
        users.bind(request.request_id, request.user)
        try:
            check_request(self.request.prompt_token_ids, self.request.params)
            while True:
                lease = await ticket.wait()
                self.attempts += 1
                self.backend = lease.backend.name
                route = lease.route
                started = False
                charged = 0
                try:
                    async with contextlib.aclosing(lease.backend.generate(self.request)) as stream:
                        async for delta in stream:
                            if not started:
                                started = True
                                self._router.charge(request.user, len(request.prompt_token_ids))
                            # Service counts the tokens streamed (the final count, for a peer that sends text only).
                            n = len(delta.token_ids)
                            if delta.finished:
                                route.completed += 1
                                n = max(n, delta.num_output_tokens - charged)
                            charged += n
                            self._router.charge(request.user, n)
                            yield delta
                    return
                except BackendError as error:
                    if started or self.attempts >= self.max_attempts:
                        route.failed += 1
                        raise
                    log.warning("request %s: backend %s failed before streaming (%s); re-routing",
                                self.request.request_id, self.backend, error)
                ticket.close()
                ticket = self._router.ticket(front=True, user=request.user, priority=request.priority)
        finally:
            users.unbind(request.request_id)
            ticket.close()
