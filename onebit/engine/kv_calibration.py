"""Scales of an e4m3 KV cache (`--kv-cache-dtype fp8`), fixed once at start-up.

One prefill of a built-in text (prose and Python, what the served models meet) runs with a small
cache in the model's dtype; the largest |K| and |V| of each layer and KV head, times a headroom,
set that head's scales (`kernels.kv_fp8`). With an MTP head, its layer reads the prefill's states
as the drafter does and gets scales of its own. The scales then never change: cached prefix blocks
stay valid, and a request's output does not depend on which requests came before it.
"""

from __future__ import annotations

import torch

from onebit.kernels import kv_fp8
from onebit.kernels.attention import AttentionMetadata
from onebit.models.config import ModelConfig
from onebit.models.rope import rope_cos_sin

CALIBRATION_TEXT = """\
The scheduler admits waiting requests while the cache has free blocks; each step decodes one token
for every running sequence and then fills the rest of its budget with chunks of prompts. When the
pool runs out, the newest sequence is preempted and recomputed later.

def merge_sorted(left: list[int], right: list[int]) -> list[int]:
    \"\"\"Merge two sorted lists into one sorted list.\"\"\"
    out, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out + left[i:] + right[j:]

Numbers such as 3.14159, 2048 and 1e-6 appear too, as do questions: how long does a step take, and why?
"""


def calibration_ids(tokenizer, vocab_size: int, max_len: int) -> list[int]:
    """The calibration prompt's token ids (at most max_len, all inside the model's vocabulary)."""
    ids = [i for i in tokenizer.encode(CALIBRATION_TEXT) if 0 <= i < vocab_size]
    return ids[:max_len] or list(range(min(max_len, vocab_size)))


@torch.inference_mode()
def calibrate_kv_scales(model, cfg: ModelConfig, token_ids: list[int], device: torch.device,
                        dtype: torch.dtype, block_size: int = 16, mtp=None) -> torch.Tensor:
    """Run one prefill of `token_ids` (and the MTP head `mtp` over it, if given), set every
    attention layer's k_scale and v_scale from the largest magnitudes it wrote, and return the
    scales [2 (K, V), layers (+1 for the MTP layer, last), kv_heads]."""
    n = len(token_ids)
    blocks = -(-n // block_size)
    layers = list(model.layers) + (list(mtp.layers) if mtp is not None else [])
    cache = torch.zeros(2, len(layers), blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                        dtype=dtype, device=device)
    arange = lambda k: torch.arange(k, dtype=torch.long, device=device)  # noqa: E731

    def prefill(m: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=arange(m), num_decodes=0, decode_block_tables=None,
                                 decode_context_lens=None, prefills=[(0, m, m)],
                                 prefill_block_tables=arange(blocks)[None])

    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    rope = rope_cos_sin(cfg, n + 1, device)
    _, prenorm = model(ids, arange(n), cache, prefill(n), rope, return_prenorm=True)
    if mtp is not None and n > 1:
        # Entry t reads h_t and token t+1, is stored at cache position t and rotated as t+1 (models.mtp).
        layer = cfg.num_layers
        mtp(model, ids[1:], prenorm[:-1], arange(n - 1) + 1, cache[0, layer], cache[1, layer], prefill(n - 1), rope)
    scales = kv_fp8.scales_from_amax(cache.abs().amax(dim=(2, 3, 5)))  # unused slots hold zeros
    for i, layer in enumerate(layers):
        layer.self_attn.k_scale = scales[0, i].contiguous()
        layer.self_attn.v_scale = scales[1, i].contiguous()
    return scales
