"""Test-only faults, to prove that one request's failure fails only that request.

Off unless the environment variable ONEBIT_INJECT_FAULTS is set (tests set it on the server they
start; nothing a client sends can turn it on). Its value is a comma-separated list of
`PLACE:USER:AFTER`: the engine raises InjectedFault at PLACE ("sampler", "detokenizer" or "drafter") for
every sequence of user USER that has at least AFTER output tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from onebit.engine.sequence import Sequence

ENV = "ONEBIT_INJECT_FAULTS"
PLACES = ("sampler", "detokenizer", "drafter")


class InjectedFault(RuntimeError):
    """The failure a test asked for."""


@dataclass(frozen=True)
class Fault:
    """Raise at `place` for `user`'s sequences once they have `after` output tokens."""

    place: str
    user: str
    after: int


class FaultInjector:
    """The faults in effect; `check()` raises when one applies to a sequence."""

    def __init__(self, faults: list[Fault]):
        self.faults = faults

    @classmethod
    def from_env(cls, environ=os.environ) -> "FaultInjector | None":
        """The faults ONEBIT_INJECT_FAULTS asks for, or None when it is unset."""
        text = environ.get(ENV, "").strip()
        if not text:
            return None
        faults = []
        for item in text.split(","):
            place, user, after = item.strip().split(":")
            if place not in PLACES:
                raise ValueError(f"{ENV}: unknown place {place!r} (one of {', '.join(PLACES)})")
            faults.append(Fault(place, user, int(after)))
        return cls(faults)

    def check(self, place: str, seq: Sequence) -> None:
        """Raise InjectedFault when a fault at `place` applies to seq now."""
        for fault in self.faults:
            if fault.place == place and fault.user == seq.user and seq.num_output_tokens >= fault.after:
                raise InjectedFault(f"injected {place} fault for user {seq.user}")
