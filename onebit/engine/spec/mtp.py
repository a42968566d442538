"""The multi-token-prediction head as a drafter.

The head reads the base model's pre-norm state at position t and the token at t + 1, and
guesses the token at t + 2; chained, it drafts several. It has its own layer of KV cache
(inside the runner's cache tensor), written for every position the target made final.
Per request this drafter keeps the last base state and its position.
"""

from __future__ import annotations

import torch

from onebit.engine.sequence import Sequence
from onebit.engine.spec.drafter import Proposals


class MtpDrafter:
    """Drafts by chaining the runner's MTP head from each sequence's last base state."""

    def __init__(self, runner, p_min: float = 0.0):
        self.runner = runner
        self.p_min = p_min
        self.states: dict[Sequence, tuple[int, torch.Tensor]] = {}  # seq -> (position, pre-norm state)

    def release(self, seq: Sequence) -> None:
        """Forget a finished request's base state."""
        self.states.pop(seq, None)

    def needs_hidden(self, plan, drafting: bool) -> bool:
        """Base states for every position the head will read: prompts (eager anyway) and
        speculative steps. Plain decode steps under load skip it and stay graph replays."""
        return drafting or any(n > 1 for _, n in plan)

    def _position(self, seq: Sequence) -> int:
        state = self.states.get(seq)
        return state[0] if state is not None else -1

    def propose(self, chosen: list[tuple[Sequence, int]]) -> Proposals:
        """Chain the head k times for each (sequence, k) whose base state is fresh (the one just
        before its last token); the others get theirs from this step."""
        chosen = [(seq, k) for seq, k in chosen if self._position(seq) == seq.num_tokens - 2]
        if not chosen:
            return []
        drafts = {seq: [] for seq, _ in chosen}
        hidden = {seq: self.states[seq][1][None] for seq, _ in chosen}
        last = {seq: seq.token_ids[-1] for seq, _ in chosen}
        stopped: set[Sequence] = set()
        for depth in range(max(k for _, k in chosen)):
            active = [seq for seq, k in chosen if k > depth and seq not in stopped]
            if not active:
                break
            entries = [(seq, seq.num_tokens - 2 + depth, [last[seq]], hidden[seq]) for seq in active]
            prenorm, normed = self.runner.mtp_forward(entries)
            logits = self.runner.model.compute_logits(normed)
            guesses = logits.argmax(dim=-1).tolist()
            confident = (logits.float().softmax(-1).amax(-1) >= self.p_min).tolist() if self.p_min > 0 else None
            for i, seq in enumerate(active):
                if confident is not None and not confident[i]:
                    stopped.add(seq)  # the head is unsure: stop this chain here
                    continue
                drafts[seq].append(guesses[i])
                hidden[seq], last[seq] = prenorm[i:i + 1], guesses[i]
        return list(drafts.items())

    def observe(self, plan, out, computed) -> None:
        """Write MTP cache entries for the positions this step made final, with the true base
        states, and keep each sequence's last base state for the next draft."""
        if out.hidden is None:
            return
        entries = []
        for (seq, _), start in zip(plan, out.starts):
            if seq.is_finished:
                continue
            first, n = computed[seq]
            n_real = min(n, seq.num_computed_tokens - first)  # kept positions of a verify step
            if n_real <= 0:
                continue
            pos = self._position(seq)
            t0 = first - 1 if pos == first - 1 and first > 0 else first
            t1 = first + n_real - 2  # the last entry whose next token is already known
            if t1 >= t0:
                states = [out.hidden[start + (t - first)][None] if t >= first else self.states[seq][1][None]
                          for t in range(t0, t1 + 1)]
                entries.append((seq, t0, seq.token_ids[t0 + 1:t1 + 2], torch.cat(states)))
            self.states[seq] = (first + n_real - 1, out.hidden[start + n_real - 1].clone())
        if entries:
            self.runner.mtp_forward(entries)
