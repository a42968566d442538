"""Hand requests back to the primary when the load falls below `--adaptive-at` again (backends on
different devices, "spill" routing).

Under load the overflow backend (plain large batches) takes what the primary (drafting, small
batches) cannot. Once the load falls, a primary slot frees and nobody waits for it: a request still
streaming on an overflow backend moves to the primary, where drafting makes it faster. The move is a
migration (`onebit.router.migration`): the stream goes on without a gap or a repeat.

Hysteresis: moves go one way only, overflow -> primary, and a request on the primary is never moved
back when the load rises again (new requests overflow instead), so a request moves at most once per
fall of the load, never back and forth.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onebit.router.routed_stream import RoutedStream
    from onebit.router.router import Router

log = logging.getLogger(__name__)


class HandOver:
    """The router's record of which streams run on the overflow backends, and the moves it offers."""

    def __init__(self, router: "Router"):
        self.router = router
        self.moves = 0  # moves carried out (an offer a stream could not take before it finished is not one)
        self._streams: dict["RoutedStream", None] = {}  # streams on overflow backends, oldest first

    def track(self, stream: "RoutedStream", route_index: int) -> None:
        """A stream started on the route at `route_index` (only overflow routes are recorded)."""
        if route_index > 0:
            self._streams[stream] = None

    def untrack(self, stream: "RoutedStream") -> None:
        """The stream ended or left its overflow backend."""
        self._streams.pop(stream, None)

    def offer(self) -> None:
        """Give free primary slots nobody waits for to overflow streams that may move (call on the loop):
        when a slot frees, and when an overflow stream streams a token (a stream may move only once it
        has streamed one, so a slot that freed earlier waits for that)."""
        router = self.router
        primary = router.routes[0]
        while (primary.in_flight < primary.limit and primary.backend.state == "ready"
               and not router.queue_size and not router.closed):
            stream = next((s for s in self._streams if s.can_move), None)
            if stream is None:
                return
            del self._streams[stream]
            lease = router.claim(primary, stream.request.user)  # counts the user as running there
            log.info("request %s: handing over from %s to %s (load fell to %d)", stream.request.request_id,
                     stream.backend, primary.name, router.in_flight)
            stream.move_to(lease)
