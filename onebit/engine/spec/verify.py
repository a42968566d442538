"""Lossless verification of drafts against the target model's logits.

Drafts are deterministic (an argmax or a copied n-gram), so verification is exact with the
point-mass form of rejection sampling: a draft d is kept with probability p(d) under the
target distribution, and on rejection the token is drawn from p with d removed. For greedy
requests that is "keep while the draft equals the argmax".
"""

from __future__ import annotations

import torch

from onebit.engine.sampler import position_seed, shape_distribution
from onebit.engine.sequence import Sequence


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
    if seq.generator is not None:  # a seeded request: the stream depends on the position only
        gen.manual_seed(position_seed(seq.params.seed, seq.num_tokens - len(drafts)))
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
