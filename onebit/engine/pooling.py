"""Embeddings: one sequence's final hidden states pooled over its prompt, chunk by chunk as its
prefill runs through the scheduler like any other request's."""

from __future__ import annotations

import torch

from onebit.engine.sampling_params import InvalidParameter

POOLING_KINDS = ("mean", "last", "cls")


class Pooler:
    """Pools the final-norm hidden states of a prompt's positions: their mean, the last, or the first
    (cls). Positions already pooled are skipped, so a prefill recomputed after preemption counts once."""

    def __init__(self, kind: str, num_prompt_tokens: int):
        if kind not in POOLING_KINDS:
            raise InvalidParameter(f"pooling must be one of {', '.join(POOLING_KINDS)}", "pooling")
        self.kind = kind
        self.n = num_prompt_tokens
        self.upto = 0  # positions [0, upto) are pooled
        self.sum: torch.Tensor | None = None
        self.first: torch.Tensor | None = None
        self.last: torch.Tensor | None = None

    def add(self, first_position: int, states: torch.Tensor) -> None:
        """Take in the states of positions first_position, first_position + 1, ... (rows of `states`)."""
        lo = max(self.upto - first_position, 0)
        hi = min(self.n - first_position, states.shape[0])
        if hi <= lo:
            return
        rows = states[lo:hi].float()
        if self.kind == "mean":
            total = rows.sum(dim=0)
            self.sum = total if self.sum is None else self.sum + total
        if first_position + lo == 0:
            self.first = rows[0].clone()
        if first_position + hi == self.n:
            self.last = rows[-1].clone()
        self.upto = first_position + hi

    def result(self) -> list[float] | None:
        """The pooled vector, L2-normalized as the OpenAI API returns embeddings (None until every
        prompt position was pooled)."""
        if self.upto < self.n:
            return None
        vector = {"mean": None if self.sum is None else self.sum / self.n, "cls": self.first,
                  "last": self.last}[self.kind]
        return torch.nn.functional.normalize(vector, dim=0).cpu().tolist()
