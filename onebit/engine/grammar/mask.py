"""The step's grammar mask: every constrained row's allowed tokens computed in parallel on the
host (llguidance's executor), sent as one bitmask and applied to the logits in one operation."""

from __future__ import annotations

import llguidance
import numpy as np
import torch

from onebit.engine.grammar.state import GrammarState
from onebit.engine.transfer import upload


class GrammarMasker:
    """Masks the logits rows of constrained requests to the tokens their grammars allow."""

    def __init__(self, vocab_size: int, device: torch.device, threads: int | None = None):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.device = device
        self.executor = llguidance.LLExecutor(threads)
        self.shifts = torch.arange(32, dtype=torch.int32, device=device)
        self.minus_inf = torch.tensor(float("-inf"), device=device)

    def fill(self, states: list[GrammarState]) -> np.ndarray:
        """One row of 32-bit words per state, bit t set when token t is allowed. A failed matcher's row
        allows everything: its request fails when its token is accepted, and no other row with it."""
        bits = np.full((len(states), self.words), -1, dtype=np.int32)
        live = [(state.matcher, i) for i, state in enumerate(states) if not state.failed]
        if live:
            self.executor.unsafe_compute_mask_ptr(live, bits.ctypes.data, self.words * 4, len(states))
        return bits

    def mask_drafts(self, logits: torch.Tensor, state: GrammarState, drafts: list[int]) -> tuple[torch.Tensor, int]:
        """For speculative verification: (the verification rows `logits` [len(drafts) + 1, vocab] masked
        position by position along the drafts the grammar allows, how many drafts it allows). Rows past
        the first disallowed draft are left out; the state is left where it was."""
        matcher = state.matcher
        valid = matcher.validate_tokens(drafts) if drafts else 0
        bits = np.full((valid + 1, self.words), -1, dtype=np.int32)
        for i in range(valid + 1):
            if not state.failed:
                matcher.unsafe_compute_mask_ptr(bits[i:].ctypes.data, self.words * 4)
            if i < valid:
                matcher.consume_token(drafts[i])
        if valid:
            matcher.rollback(valid)
        rows = logits[:valid + 1]
        allowed = self.allowed(bits)
        width = rows.shape[-1]
        if allowed.shape[-1] < width:
            allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]), value=False)
        return torch.where(allowed[:, :width], rows, self.minus_inf), valid

    def allowed(self, bits: np.ndarray) -> torch.Tensor:
        """The bitmask as booleans [rows, vocab] on the device: unpacked there on a GPU (only the
        bits cross the bus), by numpy's unpackbits on a CPU (many times faster than torch's shifts)."""
        if self.device.type != "cuda":
            unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :self.vocab_size]
            return torch.from_numpy(unpacked.view(np.bool_))
        words = torch.from_numpy(bits).pin_memory().to(self.device, non_blocking=True)
        unpacked = (words.unsqueeze(-1) >> self.shifts) & 1
        return unpacked.view(len(bits), -1)[:, :self.vocab_size].bool()

    def apply(self, logits: torch.Tensor, states: list[GrammarState | None]) -> torch.Tensor:
        """`logits` [rows, vocab] with disallowed tokens at -inf for every row that has a state
        (a new tensor when any row is constrained; the input itself otherwise)."""
        rows = [i for i, s in enumerate(states) if s is not None]
        if not rows:
            return logits
        allowed = self.allowed(self.fill([states[i] for i in rows]))
        width = logits.shape[-1]
        if allowed.shape[-1] < width:  # a model whose logits are wider than its tokenizer
            allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[-1]), value=False)
        if len(rows) < logits.shape[0]:  # free rows allow every token
            full = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
            full[upload(rows, torch.long, logits.device)] = allowed[:, :width]
            allowed = full
        return torch.where(allowed[:, :width], logits, self.minus_inf)
