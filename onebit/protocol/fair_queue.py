"""A waiting line shared fairly between users: least recent service first, arrival order within a user.

Both the router (which request gets the next free slot) and the engine scheduler (which waiting
sequence is admitted, and whose prefill runs first) use it, so it lives here, torch-free.

Fairness is by virtual time over tokens served (start-time fair queuing, simplified): every user
has a `served` count that grows by the tokens charged to it. The next item comes from the user
with the least service (ties: fewer items running, then the earlier arrival). A user that becomes
active again starts no lower than the least service among the users active now, so time spent
idle is not banked as credit for a later burst. Within a user, items go by (priority, arrival):
lower priority values first, as in vLLM.

With one user (or `fair=False`, which puts everyone in one line) the order is exactly first in,
first out, with priority first.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")

ANONYMOUS = "anonymous"


@dataclass
class UserLine(Generic[T]):
    """One user's waiting items as a heap of (priority, arrival, item), and their service so far."""

    served: float = 0.0
    running: int = 0
    heap: list = field(default_factory=list)


class FairQueue(Generic[T]):
    """Items waiting per user; `pop()` takes from the least-served user. `charge()` records service."""

    def __init__(self, fair: bool = True):
        self.fair = fair
        self._users: dict[str, UserLine[T]] = {}
        self._order = itertools.count()
        self._where: dict[int, str] = {}  # id(item) -> user, for remove() and contains
        self._clock = 0.0  # the least service among active users, last time it was known

    def _key(self, user: str | None) -> str:
        return (user or ANONYMOUS) if self.fair else ANONYMOUS

    def _line(self, user: str) -> UserLine[T]:
        line = self._users.get(user)
        if line is None:
            line = self._users[user] = UserLine(served=self._virtual_time())
        elif not line.heap and not line.running:
            line.served = max(line.served, self._virtual_time())
        return line

    def _virtual_time(self) -> float:
        active = [u.served for u in self._users.values() if u.heap or u.running]
        if active:
            self._clock = min(active)
        return self._clock

    # ---- the line ----------------------------------------------------------

    def push(self, item: T, user: str | None = None, priority: int = 0, front: bool = False) -> None:
        """Add an item at its user's place (front=True: before the user's other items of the same
        priority, e.g. a preempted or re-routed item that already waited its turn)."""
        key = self._key(user)
        line = self._line(key)
        order = -next(self._order) if front else next(self._order)
        heapq.heappush(line.heap, (priority, order, item))
        self._where[id(item)] = key

    @staticmethod
    def _turn(line: UserLine[T]) -> tuple:
        """Which waiting user goes next: least served, then fewer running, then its head's (priority, arrival)."""
        return (line.served, line.running, line.heap[0][0], line.heap[0][1])

    def _best(self) -> UserLine[T] | None:
        best, best_key = None, None
        for line in self._users.values():
            if not line.heap:
                continue
            key = self._turn(line)
            if best_key is None or key < best_key:
                best, best_key = line, key
        return best

    def peek(self) -> T | None:
        """The item `pop()` would return, or None when empty."""
        line = self._best()
        return line.heap[0][2] if line is not None else None

    def pop(self) -> T:
        """Take the next item (IndexError when empty)."""
        line = self._best()
        if line is None:
            raise IndexError("pop from an empty FairQueue")
        item = heapq.heappop(line.heap)[2]
        del self._where[id(item)]
        return item

    def remove(self, item: T) -> bool:
        """Take `item` out wherever it waits; False when it is not here."""
        key = self._where.pop(id(item), None)
        if key is None:
            return False
        line = self._users[key]
        line.heap = [entry for entry in line.heap if entry[2] is not item]
        heapq.heapify(line.heap)
        self._forget_if_idle(key)
        return True

    def _forget_if_idle(self, key: str) -> None:
        """Drop a user with nothing waiting or running whose service is not ahead of the virtual
        time (coming back, it would start there anyway), so the table holds only users that matter."""
        line = self._users.get(key)
        if line is not None and not line.heap and not line.running and line.served <= self._virtual_time():
            del self._users[key]

    def line_of(self, user: str | None) -> str:
        """The line a user's items wait in: their own, or (not fair) the one shared line."""
        return self._key(user)

    def waiting_in(self, line: str) -> list[tuple[int, T]]:
        """(priority, item) of every item waiting in `line`, in the order they would leave it."""
        entries = sorted(self._users[line].heap) if line in self._users else []
        return [(priority, item) for priority, _, item in entries]

    def user_of(self, item: T) -> str | None:
        """The line `item` waits in, or None."""
        return self._where.get(id(item))

    def __contains__(self, item: object) -> bool:
        return id(item) in self._where

    def __len__(self) -> int:
        return len(self._where)

    def __bool__(self) -> bool:
        return bool(self._where)

    def __iter__(self) -> Iterator[T]:
        """Every waiting item, in no promised order."""
        return iter([entry[2] for line in self._users.values() for entry in line.heap])

    # ---- service -----------------------------------------------------------

    def charge(self, user: str | None, tokens: float) -> None:
        """Record `tokens` of service for `user` (the tokens computed or streamed for them)."""
        if tokens > 0:
            self._line(self._key(user)).served += tokens

    def started(self, user: str | None) -> None:
        """One of the user's items is now running (counts as active; ties go to fewer running)."""
        self._line(self._key(user)).running += 1

    def ended(self, user: str | None) -> None:
        """One of the user's running items ended; forget users with nothing left and no lead."""
        key = self._key(user)
        line = self._users.get(key)
        if line is None:
            return
        line.running = max(0, line.running - 1)
        self._forget_if_idle(key)

    def served(self, user: str | None) -> float:
        """The user's service count (virtual time)."""
        line = self._users.get(self._key(user))
        return line.served if line is not None else 0.0

    # ---- views ---------------------------------------------------------------

    def position(self, item: T) -> int:
        """An estimate of the item's place in line (1 = next): its place in its user's line times
        the number of users waiting, plus its user's rank by service (round robin between users)."""
        key = self._where.get(id(item))
        if key is None:
            return 0
        line = self._users[key]
        mine = next(e for e in line.heap if e[2] is item)
        within = sum(1 for e in line.heap if e[:2] < mine[:2])
        waiting = [u for u in self._users.values() if u.heap]
        rank = sum(1 for u in waiting if self._turn(u) < self._turn(line))
        return within * len(waiting) + rank + 1

    def waiting_by_user(self) -> dict[str, int]:
        """Waiting items per user."""
        return {name: len(line.heap) for name, line in self._users.items() if line.heap}
