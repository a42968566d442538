"""Attention over the paged KV cache: the step's metadata and a plain-torch implementation.

The step's tokens are packed: first one token for each decoding sequence, then the
chunks of the prefilling sequences. Every K/V is written to the cache first (kernels/ops),
then queries read their whole context from the cache, so prefix-cache hits and chunked
prefill need no special case. This file is the reference the GPU kernels are
checked against; it runs on CPU and CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from onebit.kernels import batch_invariant, kv_fp8

try:  # the GPU kernels need triton; without it every path uses the torch reference
    from onebit.kernels import triton_decode, triton_prefill, triton_prefill_flash
except ImportError:  # pragma: no cover - depends on the install
    triton_decode = triton_prefill = triton_prefill_flash = None


@dataclass(kw_only=True)
class AttentionMetadata:
    """Where each token of a step goes in the cache and what it attends to.

    slot_mapping [T]: flat cache index (block * block_size + offset) for each token's K/V.
    num_decodes: the first num_decodes tokens are single-token decode steps.
    decode_block_tables [D, max_blocks], decode_context_lens [D]: their contexts.
    prefills: for each prefilling sequence, (query start in the packed batch,
    query length, context length after this step); prefill_block_tables [P, max_blocks]
    holds their block tables, row i for prefills[i].
    decode_num_splits, decode_max_context: the engine's fixed KV split count and context bound
    (the batch-invariant kernel's split length; the decode kernel's split count comes from the
    row count unless `triton_decode.adaptive_splits` is off).
    """

    slot_mapping: torch.Tensor
    num_decodes: int
    decode_block_tables: torch.Tensor | None
    decode_context_lens: torch.Tensor | None
    prefills: list[tuple[int, int, int]]
    prefill_block_tables: torch.Tensor | None = None
    decode_num_splits: int = 1
    decode_max_context: int | None = None


def _read(cache: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Cache entries [..., kv_heads, head_dim] as values: e4m3 ones dequantized with their head's scale."""
    return kv_fp8.dequantize(cache, scale, dtype) if kv_fp8.is_fp8(cache) else cache


def decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale, k_scale=None, v_scale=None):
    """Plain-torch decode attention: q [B, heads, head_dim], one query per sequence
    (e4m3 caches with their per-KV-head scales k_scale, v_scale)."""
    num_seqs, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = num_heads // kv_heads
    max_len = block_tables.shape[1] * k_cache.shape[1]
    keys = _read(k_cache[block_tables], k_scale, torch.float32).reshape(num_seqs, max_len, kv_heads, head_dim)
    values = _read(v_cache[block_tables], v_scale, torch.float32).reshape(num_seqs, max_len, kv_heads, head_dim)
    qg = q.view(num_seqs, kv_heads, group, head_dim).float()
    scores = torch.einsum("bkgd,bnkd->bkgn", qg, keys.float()) * scale
    valid = torch.arange(max_len, device=q.device)[None, :] < context_lens[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = scores.softmax(dim=-1)
    out = torch.einsum("bkgn,bnkd->bkgd", probs, values.float())
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def prefill_attention_ref(q, k_cache, v_cache, context_len, block_table, scale, k_scale=None, v_scale=None):
    """Causal attention of one sequence's n new queries [n, heads, head_dim] over its whole context
    (e4m3 caches with their per-KV-head scales k_scale, v_scale)."""
    n, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    used = block_table[:-(-context_len // k_cache.shape[1])]
    keys = _read(k_cache[used], k_scale, q.dtype).reshape(-1, kv_heads, head_dim)[:context_len].transpose(0, 1)
    values = _read(v_cache[used], v_scale, q.dtype).reshape(-1, kv_heads, head_dim)[:context_len].transpose(0, 1)
    gqa = num_heads != kv_heads
    if n == context_len:  # nothing cached before: plain causal attention (flash kernels on GPU)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, is_causal=True, scale=scale,
                                             enable_gqa=gqa)
        return out.transpose(0, 1)
    # Query i sits at position context_len - n + i and sees keys 0..that position.
    q_pos = torch.arange(context_len - n, context_len, device=q.device)
    mask = torch.arange(context_len, device=q.device)[None, :] <= q_pos[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask, scale=scale,
                                         enable_gqa=gqa)
    return out.transpose(0, 1)


def _decode_splits(meta: AttentionMetadata) -> int | None:
    # adaptive: the split count from the row count (graph-safe), each context split evenly; else the
    # engine's fixed split count and length
    return None if triton_decode.adaptive_splits else meta.decode_num_splits


def decode_quantizes(q: torch.Tensor, meta: AttentionMetadata) -> bool:
    """Whether `paged_decode_attention_quantized` can run this step: every token a decode, on the GPU's
    decode kernel (not in deterministic mode, whose kernel differs)."""
    return (q.is_cuda and triton_decode is not None and not batch_invariant.enabled()
            and meta.num_decodes == q.shape[0] and not meta.prefills)


def paged_decode_attention_quantized(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                     meta: AttentionMetadata, scale: float, block: int,
                                     k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """`paged_attention` of a decode-only step (`decode_quantizes`) as e4m3 rows [T, heads * head_dim]
    with one float32 scale per row and block of `block` values (the query heads of one KV head):
    what `fp8.quantize_row_blocks` makes of the plain output, written by the attention's own kernel."""
    return triton_decode.paged_decode_attention(
        q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale, _decode_splits(meta),
        meta.decode_max_context, k_scale, v_scale, quantize_block=block)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [T, heads, head_dim] over the cached contexts; returns [T, heads, head_dim].
    e4m3 caches come with their per-KV-head scales k_scale and v_scale ([kv_heads] float32). In
    deterministic mode (`batch_invariant.mode`) every token takes the batch-invariant kernel."""
    if batch_invariant.enabled():
        return batch_invariant.attention(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    d = meta.num_decodes
    if d:
        if q.is_cuda and triton_decode is not None:
            # written into the step's output in place: a copy kernel per layer otherwise
            triton_decode.paged_decode_attention(
                q[:d], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale,
                _decode_splits(meta), meta.decode_max_context, k_scale, v_scale, out=out[:d])
        else:
            out[:d] = decode_attention_ref(q[:d], k_cache, v_cache, meta.decode_block_tables,
                                           meta.decode_context_lens, scale, k_scale, v_scale)
    if not meta.prefills:
        return out
    if q.is_cuda and triton_prefill is not None:
        starts, lens, ctxs = (list(col) for col in zip(*meta.prefills))
        if triton_prefill_flash.enabled:
            plan = getattr(meta, "_flash_prefill_plan", None)
            if plan is None:  # once per step, not once per layer
                plan = triton_prefill_flash.plan_tiles(starts, lens, ctxs, q.shape[1], k_cache.shape[2], q.device)
                meta._flash_prefill_plan = plan
            triton_prefill_flash.paged_prefill_attention(q, k_cache, v_cache, starts, lens, ctxs,
                                                         meta.prefill_block_tables, scale, out=out,
                                                         k_scale=k_scale, v_scale=v_scale, plan=plan)
            return out
        triton_prefill.paged_prefill_attention(q, k_cache, v_cache, starts, lens, ctxs,
                                               meta.prefill_block_tables, scale, out=out,
                                               k_scale=k_scale, v_scale=v_scale)
        return out
    for i, (start, length, context_len) in enumerate(meta.prefills):
        out[start:start + length] = prefill_attention_ref(
            q[start:start + length], k_cache, v_cache, context_len, meta.prefill_block_tables[i], scale,
            k_scale, v_scale)
    return out
