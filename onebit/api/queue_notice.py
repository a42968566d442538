"""SSE comment lines that tell a waiting stream its place in line (`: queued position N`).

Lines starting with ':' are comments in server-sent events: SSE clients (the OpenAI SDK among
them) ignore them, a person watching with curl sees the request is alive and where it stands.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from onebit.router import Router, Ticket

NOTICE_EVERY_S = 1.0


def queued_comment(position: int) -> str:
    """The SSE comment for one place in line."""
    return f": queued position {position}\n\n"


async def queue_notices(router: Router, tickets: list[Ticket]) -> AsyncIterator[str]:
    """A comment when the request starts waiting and whenever its place changes, until one of its
    tickets holds a slot (so a choice that already runs is never held back)."""
    last = None
    while tickets and not any(t.done for t in tickets):
        position = min(router.position(t) for t in tickets)
        if position and position != last:
            last = position
            yield queued_comment(position)
        await asyncio.wait([t.future for t in tickets], timeout=NOTICE_EVERY_S,
                           return_when=asyncio.FIRST_COMPLETED)
