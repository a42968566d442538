"""Prompt-lookup drafting: propose what followed the latest earlier occurrence of the tail."""

from __future__ import annotations

from onebit.engine.sequence import Sequence
from onebit.engine.spec.drafter import StatelessDrafter


def ngram_propose(tokens: list[int], k: int, n_max: int = 3, window: int = 512) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = n_max..1)
    and propose the up to k tokens that followed it."""
    size = len(tokens)
    lo = max(0, size - window)
    for n in range(min(n_max, size - 1), 0, -1):
        tail = tokens[size - n:]
        last = tail[-1]
        for end in range(size - 2, lo + n - 2, -1):  # end = index of the candidate's last token
            if tokens[end] == last and tokens[end - n + 1:end + 1] == tail:
                follow = tokens[end + 1:end + 1 + k]
                if follow:
                    return follow
    return []


class NgramDrafter(StatelessDrafter):
    """Prompt-lookup drafting behind the drafter protocol."""

    def propose_one(self, seq: Sequence, k: int) -> list[int]:
        """What followed the latest earlier match of the sequence's tail."""
        return ngram_propose(seq.token_ids, k)
