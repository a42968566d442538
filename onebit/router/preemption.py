"""Priority preemption in the router (`--priority-preempt`), for every kind of backend.

Requests wait only in the router: each backend is given at most its slots, so no engine, llama-server
or peer ever sees a request that waits, and none of them can preempt for it. The router does: a
waiting request takes the slot of a running one that it would have gone before in the line.

The rule. `priority` is a field the client chooses, so it orders requests only inside one fair line:
one user's line under fair share (the default), the one shared line with `--no-fair-share`. A waiting
request preempts a running request of its own line whose priority value is larger (lower is sooner, as
in vLLM), never another user's: a user cannot buy another user's slot with `priority: -1000`, and the
slots each user holds, hence the fair share, do not change. Without fair share every request is in one
line and priority preempts across all of them, as vLLM's priority scheduling does.

The victim is the running request of that line with the largest priority value, the latest started
of those (it loses the least work). At its next delta it hands its slot straight to the waiting request
(the slot is not freed, so no other user's request can take it in between), goes back to the front of
its line (its priority still puts it behind the request that preempted it), and later continues from
its prompt plus the tokens already streamed (`onebit.router.migration`): its client's stream goes on
with no error, gap or repeat. A stream whose token ids are unknown (a text-only peer) is never chosen.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from onebit.router.slots import Lease

if TYPE_CHECKING:
    from onebit.router.routed_stream import RoutedStream
    from onebit.router.router import Router

log = logging.getLogger(__name__)


class Preemption:
    """The router's record of running streams per line, and which of them must yield their slot."""

    def __init__(self, router: "Router"):
        self.router = router
        self.preemptions = 0  # slots handed from a running request to a more urgent one of its line
        self._order = itertools.count()
        self._running: dict["RoutedStream", int] = {}  # stream -> start order
        self.yielding: set["RoutedStream"] = set()  # asked to give up their slot at their next delta

    def _line(self, stream: "RoutedStream") -> str:
        return self.router.line_of(stream.request.user)

    def track(self, stream: "RoutedStream") -> None:
        """A stream started on a slot."""
        self._running[stream] = next(self._order)
        self.review(self._line(stream))

    def untrack(self, stream: "RoutedStream") -> None:
        """A stream left its slot (finished, failed, moved or preempted)."""
        if self._running.pop(stream, None) is not None:
            was_yielding = stream in self.yielding
            self.yielding.discard(stream)
            if was_yielding:  # it ended before it could yield: another may have to
                self.review(self._line(stream))

    def review(self, line: str) -> None:
        """Ask as many of the line's running streams to yield as it has waiting requests that would go
        before them: the i-th most urgent waiting request against the i-th least urgent running one."""
        waiting = [p for p, _ in self.router.waiting_in(line)]
        running = sorted((s for s in self._running if self._line(s) == line and s.can_yield),
                         key=lambda s: (s.request.priority, self._running[s]), reverse=True)
        victims = {s for s, p in zip(running, waiting) if p < s.request.priority}
        for stream in running:
            if stream in victims:
                self.yielding.add(stream)
            else:
                self.yielding.discard(stream)

    def pass_slot(self, stream: "RoutedStream", lease: Lease) -> bool:
        """At a delta of a yielding stream: hand its slot to the most urgent waiting request of its line,
        if that one goes before it; True if it did (the stream then leaves the backend and waits again)."""
        self.yielding.discard(stream)
        router = self.router
        line = self._line(stream)
        head = next(iter(router.waiting_in(line)), None)
        if head is None or head[0] >= stream.request.priority:
            return False
        router.pass_slot(lease, head[1])
        self.preemptions += 1
        lease.route.preempted += 1
        log.info("request %s (priority %d) yields its slot on %s to a request of priority %d of the same line; "
                 "it continues later", stream.request.request_id, stream.request.priority, lease.backend.name,
                 head[0])
        return True

