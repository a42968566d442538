"""The oracle drafter: a measuring instrument for speculative decoding, never a way to serve.

Random-weight models have no meaningful draft acceptance, so speed-up against acceptance is
measured with drafts of a chosen quality: each drafted token is the target's own greedy token
(read from a recorded plain greedy run of the same prompt) with probability P, and a wrong
token otherwise. Verification stays the real, lossless one; only the proposals are staged.

It plugs into the engine through the drafter protocol as a "custom" speculative method:
`LLM(model, speculative=oracle_speculation(P, RECORD))`, or from the command line with the
benchmark-only `1bit serve --draft oracle:P --draft-record FILE` (hidden from `--help`;
see bench/README.md).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from onebit.engine.sequence import Sequence
from onebit.engine.spec.config import SpeculativeConfig
from onebit.engine.spec.drafter import StatelessDrafter

log = logging.getLogger("onebit.bench.oracle")


class OracleDrafter(StatelessDrafter):
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
            for line in Path(path).read_text().splitlines():
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


@dataclass
class OracleFactory:
    """Builds the oracle in the engine's process (a picklable drafter_factory)."""

    p: float
    record: str

    def __call__(self, vocab_size: int, seed: int = 0) -> OracleDrafter:
        """The drafter, reading the record now."""
        log.warning("speculative decoding with the ORACLE drafter: a measuring instrument that reads "
                    "recorded outputs (%s); never a way to serve", self.record)
        return OracleDrafter(OracleDrafter.read_record(self.record), self.p, vocab_size, seed)


def oracle_speculation(p: float | None, record: str | Path | None, draft_max: int = 3,
                       policy: str = "auto") -> SpeculativeConfig:
    """The speculative config that runs the oracle; ValueError unless both P in [0, 1] and a record are given."""
    if p is None or record is None:
        raise ValueError("the oracle (a measuring instrument) needs both P and a recorded greedy run")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"the oracle's probability must be in [0, 1], got {p}")
    return SpeculativeConfig("custom", draft_max=draft_max, policy=policy,
                             drafter_factory=OracleFactory(p, str(record)))
