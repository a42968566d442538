"""Per-user counts the router keeps for /queue, /slots and /metrics: names and numbers, never texts."""

from __future__ import annotations

import time
from dataclasses import dataclass

from onebit.protocol.fair_queue import ANONYMOUS

MAX_USERS = 1000  # distinct names kept; beyond it new names count as "other" (a client picks `user`)
OTHER = "other"


@dataclass
class UserCounts:
    """What one user has running and waiting now, and was served so far."""

    running: int = 0
    waiting: int = 0
    requests: int = 0  # slots taken over the user's life
    tokens_served: int = 0
    wait_s: float = 0.0  # total seconds its requests spent waiting for a slot

    def to_json(self, name: str) -> dict:
        """The /queue entry."""
        return {"user": name, "running": self.running, "waiting": self.waiting, "requests": self.requests,
                "tokens_served": self.tokens_served, "wait_seconds": round(self.wait_s, 3)}


class UserBook:
    """Counts per user name, updated by the router on the event loop thread."""

    def __init__(self):
        self.users: dict[str, UserCounts] = {}
        self._requests: dict[str, str] = {}  # request id -> user, while it streams
        self._queued_at: dict[str, list[float]] = {}

    def _name(self, user: str | None) -> str:
        """The name counts are kept under: the user's, or "other" once MAX_USERS names are known."""
        name = user or ANONYMOUS
        return name if name in self.users or len(self.users) < MAX_USERS else OTHER

    def _get(self, user: str | None) -> UserCounts:
        name = self._name(user)
        counts = self.users.get(name)
        if counts is None:
            counts = self.users[name] = UserCounts()
        return counts

    def joined_queue(self, user: str | None) -> None:
        """A request of the user started waiting."""
        self._get(user).waiting += 1
        self._queued_at.setdefault(self._name(user), []).append(time.monotonic())

    def left_queue(self, user: str | None) -> None:
        """A request of the user stopped waiting (it got a slot or gave up); its wait is counted
        from the user's oldest waiting request (one user's line is mostly first in, first out)."""
        counts = self._get(user)
        counts.waiting = max(0, counts.waiting - 1)
        name = self._name(user)
        stamps = self._queued_at.get(name)
        if stamps:
            counts.wait_s += time.monotonic() - stamps.pop(0)
            if not stamps:
                del self._queued_at[name]

    def started(self, user: str | None) -> None:
        """A request of the user took a slot."""
        counts = self._get(user)
        counts.running += 1
        counts.requests += 1

    def ended(self, user: str | None) -> None:
        """A request of the user gave its slot back."""
        counts = self._get(user)
        counts.running = max(0, counts.running - 1)

    def charge(self, user: str | None, tokens: int) -> None:
        """Tokens served to the user."""
        self._get(user).tokens_served += tokens

    def bind(self, request_id: str, user: str | None) -> None:
        """Remember whose request this is while it streams (for /slots)."""
        self._requests[request_id] = user or ANONYMOUS

    def unbind(self, request_id: str) -> None:
        """The request ended."""
        self._requests.pop(request_id, None)

    def user_of_request(self, request_id: str | None) -> str | None:
        """The user a streaming request belongs to, or None."""
        return self._requests.get(request_id) if request_id else None

    def active(self, user: str | None) -> int:
        """The user's requests running or waiting now."""
        counts = self.users.get(user or ANONYMOUS)
        return counts.running + counts.waiting if counts else 0

    def snapshot(self) -> list[dict]:
        """Every known user's counts, most active first."""
        rows = [c.to_json(name) for name, c in self.users.items()]
        return sorted(rows, key=lambda r: (-(r["running"] + r["waiting"]), r["user"]))
