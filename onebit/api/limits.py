"""Per-key limits (requests at once, requests waiting, tokens per minute) -> 429 with Retry-After.

A key's limits come from the key file (`onebit.api.auth`). Requests running or waiting and
requests waiting are the router's counts for the key's user; tokens per minute is a sliding
window of the last 60 seconds over prompt tokens (counted at admission) and completion
tokens (counted when a choice ends).
"""

from __future__ import annotations

import collections
import math
import time

from onebit.api.auth import KeyInfo
from onebit.api.errors import RateLimited
from onebit.router.user_book import UserBook

WINDOW_S = 60.0
RETRY_BUSY_S = 1  # a slot or place in line frees when some request ends: try again soon


class TokenWindow:
    """Tokens used in the last minute: (time, tokens) entries, the old ones dropped as time passes."""

    def __init__(self):
        self.entries: collections.deque[tuple[float, int]] = collections.deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        while self.entries and self.entries[0][0] <= now - WINDOW_S:
            self.total -= self.entries.popleft()[1]

    def add(self, tokens: int, now: float) -> None:
        """Record tokens used now."""
        if tokens > 0:
            self.entries.append((now, tokens))
            self.total += tokens

    def used(self, now: float) -> int:
        """Tokens in the window ending now."""
        self._expire(now)
        return self.total

    def seconds_until_below(self, limit: int, now: float) -> int:
        """Whole seconds until the window holds fewer than `limit` tokens."""
        self._expire(now)
        total = self.total
        for stamp, tokens in self.entries:
            total -= tokens
            if total < limit:
                return max(1, math.ceil(stamp + WINDOW_S - now))
        return 1


class RateLimits:
    """Checks a request against its key's limits and records the tokens it uses."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._windows: dict[str, TokenWindow] = {}

    def check(self, user: str, key: KeyInfo | None, count: int, prompt_tokens: int, users: UserBook) -> None:
        """Raise RateLimited when `count` more requests (of `prompt_tokens` in all) would pass a limit."""
        if key is None:
            return
        if key.max_concurrent is not None and users.active(user) + count > key.max_concurrent:
            raise RateLimited(f"key '{key.name}' may have {key.max_concurrent} requests running or waiting at "
                              f"once; {users.active(user)} are, this one asks for {count}", RETRY_BUSY_S)
        waiting = users.users[user].waiting if user in users.users else 0
        if key.max_queued is not None and waiting + count > key.max_queued:
            raise RateLimited(f"key '{key.name}' may have {key.max_queued} requests waiting; {waiting} are",
                              RETRY_BUSY_S)
        if key.tpm is not None:
            now = self._clock()
            window = self._windows.setdefault(user, TokenWindow())
            if window.used(now) >= key.tpm:
                raise RateLimited(f"key '{key.name}' may use {key.tpm} tokens per minute; the last minute used "
                                  f"{window.used(now)}", window.seconds_until_below(key.tpm, now))
            window.add(prompt_tokens, now)

    def record(self, user: str, key: KeyInfo | None, tokens: int) -> None:
        """Completion tokens the key's user just used (only keys with a tokens-per-minute limit count)."""
        if key is not None and key.tpm is not None:
            self._windows.setdefault(user, TokenWindow()).add(tokens, self._clock())
