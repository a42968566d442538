"""Speculative decoding: draft proposers, lossless verification, and the policy that decides
whether drafting pays for the current batch.

Drafts are deterministic (an argmax or a copied n-gram), so verification is exact with the
point-mass form of rejection sampling: a draft d is kept with probability p(d) under the
target distribution, and on rejection the token is drawn from p with d removed. For greedy
requests that is "keep while the draft equals the argmax".
"""

from __future__ import annotations

import torch

from onebit.engine.sampler import shape_distribution
from onebit.engine.sequence import Sequence


def can_draft(seq: Sequence) -> bool:
    """Requests whose sampling depends on per-position state (penalties, bias, bans, logprobs) never draft."""
    p = seq.params
    return not (p.has_penalties or p.logit_bias or p.logprobs is not None
                or seq.num_output_tokens < p.min_tokens)


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


class NgramDrafter:
    """Prompt-lookup drafting behind the engine's drafter interface."""

    def propose(self, chosen: list[tuple[Sequence, int]]) -> list[tuple[Sequence, list[int]]]:
        """Drafts for each (sequence, k): what followed the latest earlier match of its tail."""
        return [(seq, ngram_propose(seq.token_ids, k)) for seq, k in chosen]

    def release(self, seq: Sequence) -> None:
        """Nothing is kept per request."""


def verify(logits: torch.Tensor, seq: Sequence, drafts: list[int],
           generator: torch.Generator | None) -> tuple[int, int]:
    """Check drafts against the target rows logits [len(drafts) + 1, vocab]; return
    (number of drafts kept, the token that follows them)."""
    if seq.params.greedy:
        targets = logits.argmax(dim=-1).tolist()
        kept = 0
        while kept < len(drafts) and drafts[kept] == targets[kept]:
            kept += 1
        return kept, targets[kept]
    probs = shape_distribution(logits.float(), [seq] * logits.shape[0])
    gen = seq.generator or generator
    uniforms = torch.rand(len(drafts) + 1, generator=gen, device=probs.device).tolist()
    for i, d in enumerate(drafts):
        p = probs[i]
        if uniforms[i] < p[d].item():
            continue
        residual = p.clone()
        residual[d] = 0.0
        if residual.sum() <= 0:  # p was a point mass on d; cannot happen when d was rejected
            return i, d
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=gen).item())
    return len(drafts), int(torch.multinomial(probs[len(drafts)], 1, generator=gen).item())


class DraftPolicy:
    """Decides per step how many tokens to draft (0 = a plain decode step), from measured step
    times and observed acceptance.

    Step times are kept per (draft length, batch-size bucket); the chosen k maximises expected
    tokens per second of the whole batch: (1 + a + a^2 + ... + a^k) / time(k). A pair never
    measured is tried once; every `explore_every` steps the runner-up is re-measured so the
    estimates follow the machine and the load. With `always`, every step drafts k_max.
    """

    def __init__(self, k_max: int, explore_every: int = 1024, always: bool = False):
        self.k_max = k_max
        self.always = always  # draft k_max whenever possible, measured or not
        self.explore_every = explore_every
        self.times: dict[tuple[int, int], float] = {}
        self.acceptance = 0.6  # prior until the first verification
        self.steps = 0

    @staticmethod
    def bucket(batch: int) -> int:
        """Power-of-two bucket of a batch size."""
        return 1 << max(batch - 1, 0).bit_length()

    def expected_tokens(self, k: int) -> float:
        """Expected tokens per sequence per step with k drafts at the current acceptance."""
        a = min(max(self.acceptance, 0.0), 0.999)
        return 1.0 + sum(a ** i for i in range(1, k + 1))

    def choose(self, batch: int) -> int:
        """The draft length for this step's batch (0: plain step)."""
        self.steps += 1
        if self.always:
            return self.k_max
        b = self.bucket(batch)
        for k in range(self.k_max, -1, -1):
            if (k, b) not in self.times:
                return k
        ranked = sorted(range(self.k_max + 1), key=lambda k: -self.expected_tokens(k) / self.times[(k, b)])
        if self.steps % self.explore_every == 0:
            return ranked[1]
        return ranked[0]

    def record_step(self, batch: int, k: int, seconds: float) -> None:
        """Fold a measured step time into its (k, bucket) estimate (exponential moving average)."""
        key = (k, self.bucket(batch))
        old = self.times.get(key)
        self.times[key] = seconds if old is None else 0.8 * old + 0.2 * seconds

    def record_acceptance(self, proposed: int, accepted: int) -> None:
        """Fold one verification into the estimate of the chance that a draft is kept given the
        ones before it were (each kept draft is a success; the first rejected one a failure)."""
        if proposed:
            attempts = accepted + (1 if accepted < proposed else 0)
            self.acceptance = 0.9 * self.acceptance + 0.1 * (accepted / attempts)
