"""One request inside the engine: its tokens, cache blocks, progress and sampling state."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from onebit.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SpecState:
    """A request's speculative decoding state: unverified drafts sitting at the end of its
    token_ids, and the drafts verified and kept over its life."""

    num_draft: int = 0
    drafted: int = 0
    accepted: int = 0


class Sequence:
    """A request's token list (prompt then output) and everything the engine tracks about it."""

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 max_total_tokens: int, arrival: int, user: str = "anonymous", priority: int = 0):
        self.request_id = request_id
        self.user = user  # whose request: the scheduler shares slots and prefill fairly between users
        self.priority = priority  # lower is sooner, among one user's requests
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_total_tokens = max_total_tokens
        self.arrival = arrival
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.slot: int | None = None
        self.finish_reason: str | None = None
        self.generator: torch.Generator | None = None
        self.output_counts: dict[int, int] = {}
        self.detokenizer = None
        self.stop_matcher = None
        self.spec = SpecState()
        self.grammar = None  # a GrammarState (engine/grammar) when the output is constrained
        self.pooler = None  # an embedding request's Pooler (onebit/engine/pooling.py)
        # Overlapped steps: the last token id is a placeholder for the token the previous step
        # sampled, still on the device at this row of its sampled tokens (see LLMEngine.step).
        self.fed_row: int | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_draft(self) -> int:
        """Unverified drafts at the end of token_ids."""
        return self.spec.num_draft

    @num_draft.setter
    def num_draft(self, value: int) -> None:
        self.spec.num_draft = value

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose K/V is not yet in the cache."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        """True once the sequence stopped for any reason."""
        return self.status is SequenceStatus.FINISHED

    def drop_drafts(self, keep: int = 0) -> None:
        """Remove unverified drafts from the end of token_ids, keeping the first `keep`."""
        drop = self.num_draft - keep
        if drop > 0:
            del self.token_ids[-drop:]
            self.num_draft = keep

    def add_placeholder(self, row: int) -> None:
        """Stand in for a sampled token the host has not seen yet (row `row` of the device tensor
        that holds it), so the next step can compute its position before the token is known."""
        self.token_ids.append(0)
        self.fed_row = row

    def append(self, token_id: int) -> None:
        """Add a generated token (in place of the placeholder, when one stands in for it)."""
        if self.fed_row is not None:
            self.token_ids[-1] = token_id
            self.fed_row = None
        else:
            self.token_ids.append(token_id)
        self.output_counts[token_id] = self.output_counts.get(token_id, 0) + 1
