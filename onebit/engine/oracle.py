"""The oracle drafter: a measuring instrument for speculative decoding, never a way to serve.

Random-weight models have no meaningful draft acceptance, so speed-up against acceptance is
measured with drafts of a chosen quality: each drafted token is the target's own greedy token
(read from a recorded plain greedy run of the same prompt) with probability P, and a wrong
token otherwise. Verification stays the real, lossless one; only the proposals are staged.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from onebit.engine.sequence import Sequence


class OracleDrafter:
    """Proposes recorded greedy continuations, each token right with probability `p`."""

    def __init__(self, record: dict[tuple[int, ...], list[int]], p: float, vocab_size: int, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"the oracle's probability must be in [0, 1], got {p}")
        self.record = record
        self.p = p
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    @staticmethod
    def read_record(path: str | Path) -> dict[tuple[int, ...], list[int]]:
        """A recorded greedy run: JSON lines of {"prompt_token_ids": [...], "output_token_ids": [...]}."""
        record = {}
        try:
            for number, line in enumerate(Path(path).read_text().splitlines(), 1):
                if line.strip():
                    entry = json.loads(line)
                    record[tuple(entry["prompt_token_ids"])] = list(entry["output_token_ids"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read the oracle record {path}: {exc}") from None
        return record

    @staticmethod
    def write_record(path: str | Path, runs: list[tuple[list[int], list[int]]]) -> None:
        """Write (prompt ids, greedy output ids) pairs in the format read_record reads."""
        lines = [json.dumps({"prompt_token_ids": p, "output_token_ids": o}) for p, o in runs]
        Path(path).write_text("\n".join(lines) + "\n")

    def propose(self, chosen: list[tuple[Sequence, int]]) -> list[tuple[Sequence, list[int]]]:
        """Drafts for each (sequence, k), the engine's drafter interface."""
        return [(seq, self.propose_one(seq, k)) for seq, k in chosen]

    def release(self, seq: Sequence) -> None:
        """Nothing is kept per request."""

    def propose_one(self, seq: Sequence, k: int) -> list[int]:
        """Up to k drafts for the sequence's next positions; none for prompts not in the record."""
        truth = self.record.get(tuple(seq.token_ids[:seq.num_prompt_tokens]))
        if truth is None:
            return []
        done = seq.num_output_tokens
        drafts = []
        for token in truth[done:done + k]:
            if self.rng.random() >= self.p:
                token = (token + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
            drafts.append(token)
        return drafts
