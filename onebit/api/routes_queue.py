"""GET /queue: who is running and waiting, per user (names and counts, never texts)."""

from __future__ import annotations

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/queue")
async def queue(http: Request) -> dict:
    """Slots in use and requests waiting, in all and per user, with each user's tokens served and
    seconds waited so far."""
    state = http.app.state.server
    router_ = state.router
    return {"running": router_.in_flight, "waiting": router_.queue_size, "max_queue": router_.max_queue,
            "total_slots": sum(r.limit for r in router_.routes), "fair_share": router_.fair,
            "priority_preempt": router_.preemption is not None,
            "preemptions": router_.preemption.preemptions if router_.preemption is not None else 0,
            "users": router_.users.snapshot()}
