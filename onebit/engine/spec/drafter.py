"""The one protocol every drafter implements, and the trivial n-gram drafter's helpers."""

from __future__ import annotations

from typing import Protocol

from onebit.engine.sequence import Sequence

Proposals = list[tuple[Sequence, list[int]]]


class Drafter(Protocol):
    """Proposes draft tokens for decoding sequences; the target model verifies them.

    propose([(seq, k)]) -> [(seq, up to k drafts)]: best effort, never fails a request.
    observe(plan, out, computed): called after every step whose results are final, with the
    step's plan, the runner's StepOutput and {seq: (computed before, computed in the step)}.
    release(seq): forget a finished, aborted or failed request.
    needs_hidden(plan, drafting): whether this step's forward must return base-model states.
    """

    def propose(self, chosen: list[tuple[Sequence, int]]) -> Proposals:
        """Up to k drafts for each (sequence, k)."""

    def observe(self, plan, out, computed) -> None:
        """Learn from a finished step."""

    def release(self, seq: Sequence) -> None:
        """Drop whatever is kept for `seq`."""

    def needs_hidden(self, plan, drafting: bool) -> bool:
        """True when the step must keep the base model's pre-norm states."""


class StatelessDrafter:
    """Base for drafters that keep nothing per request and need no model states."""

    def propose(self, chosen: list[tuple[Sequence, int]]) -> Proposals:
        """Drafts for each (sequence, k), from `propose_one`."""
        return [(seq, self.propose_one(seq, k)) for seq, k in chosen]

    def propose_one(self, seq: Sequence, k: int) -> list[int]:
        """Up to k drafts for one sequence."""
        raise NotImplementedError

    def observe(self, plan, out, computed) -> None:
        """Nothing to learn."""

    def release(self, seq: Sequence) -> None:
        """Nothing is kept per request."""

    def needs_hidden(self, plan, drafting: bool) -> bool:
        """Never."""
        return False
