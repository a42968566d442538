"""The engine's waiting line and prefill order, shared fairly between users.

`WaitingLine` is the scheduler's queue of waiting sequences with the deque operations it uses
(`append`, `appendleft`, `popleft`, `[0]`, `remove`, `in`, `len`), backed by the shared
`FairQueue`: the next sequence admitted is the least-served user's, in (priority, arrival)
order within that user; with one user it is exactly first in, first out. Service is the
tokens the scheduler plans for a user's sequences (prompt chunks and decodes alike).
"""

from __future__ import annotations

from typing import Iterator

from onebit.engine.sequence import Sequence
from onebit.protocol.fair_queue import FairQueue


class WaitingLine:
    """Waiting sequences per user; `charge()` records the tokens a user's sequences were given."""

    def __init__(self, fair: bool = True):
        self.line: FairQueue[Sequence] = FairQueue(fair)

    def append(self, seq: Sequence) -> None:
        """A new sequence joins its user's line."""
        self.line.push(seq, seq.user, seq.priority)

    def appendleft(self, seq: Sequence) -> None:
        """A preempted sequence goes back before every other sequence of its user."""
        self.line.push(seq, seq.user, seq.priority, front=True)

    def __getitem__(self, index: int) -> Sequence:
        if index != 0 or not self.line:
            raise IndexError("only the head of the waiting line can be read")
        return self.line.peek()

    def popleft(self) -> Sequence:
        """Take the next sequence to admit."""
        return self.line.pop()

    def remove(self, seq: Sequence) -> None:
        """Take seq out (ValueError when it does not wait, as deque.remove)."""
        if not self.line.remove(seq):
            raise ValueError("sequence is not waiting")

    def __contains__(self, seq: object) -> bool:
        return seq in self.line

    def __len__(self) -> int:
        return len(self.line)

    def __bool__(self) -> bool:
        return bool(self.line)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self.line)

    def started(self, seq: Sequence) -> None:
        """seq took a slot."""
        self.line.started(seq.user)

    def stopped(self, seq: Sequence) -> None:
        """seq left its slot (finished, aborted or preempted)."""
        self.line.ended(seq.user)

    def charge(self, plan: list[tuple[Sequence, int]]) -> None:
        """Count the step's planned tokens as service to their users."""
        for seq, n in plan:
            self.line.charge(seq.user, n)

    def fair_order(self, running: list[Sequence]) -> list[Sequence]:
        """The running sequences in the order they take the step's token budget: as they are when
        one user runs (FIFO), else the least-served user's first (stable within a user)."""
        if len({seq.user for seq in running}) <= 1 or not self.line.fair:
            return list(running)
        return sorted(running, key=lambda seq: self.line.served(seq.user))
