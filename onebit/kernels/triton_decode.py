"""Triton paged-attention decode kernel: one query token per sequence over its cached context.

GQA-aware: one program handles one KV head for all the query heads that share it, so each
K/V byte is read once per sequence. The context is split into `num_splits` ranges handled by
separate programs (long contexts with few sequences still fill the GPU); a second small kernel
merges the partial softmaxes. Reference: `onebit.kernels.attention.decode_attention_ref`.
Runs under TRITON_INTERPRET=1 on CPU tensors too, which is how the CPU tests check it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, part_acc_ptr, part_ml_ptr, k_scale_ptr, v_scale_ptr,
    scale, max_blocks, split_len,
    stride_qb, stride_qh, stride_kb, stride_kt, stride_kh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, NUM_SPLITS: tl.constexpr, KV_FP8: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    ctx_len = tl.load(lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, ctx_len)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None], other=0.0)
    if KV_FP8:  # e4m3 entries: K's head scale folds into the score scale, V's into the output
        scale = scale * tl.load(k_scale_ptr + kv_head)

    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for t0 in range(start, end, TILE):
        tokens = t0 + tl.arange(0, TILE)
        tok_ok = tokens < end
        blocks = tl.load(tables_ptr + seq * max_blocks + tokens // BLOCK_SIZE, mask=tok_ok, other=0)
        offs = blocks.to(tl.int64) * stride_kb + (tokens % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + offs[:, None] + dims[None, :], mask=tok_ok[:, None], other=0.0)
        v = tl.load(v_ptr + offs[:, None] + dims[None, :], mask=tok_ok[:, None], other=0.0)
        if KV_FP8:
            k, v = k.to(q.dtype), v.to(q.dtype)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m = m_new
    if KV_FP8:
        acc = acc * tl.load(v_scale_ptr + kv_head)

    base = (seq * num_kv_heads + kv_head) * NUM_SPLITS + split
    tl.store(part_acc_ptr + (base * GROUP_PAD + rows[:, None]) * HEAD_DIM + dims[None, :], acc)
    tl.store(part_ml_ptr + (base * GROUP_PAD + rows) * 2, m)
    tl.store(part_ml_ptr + (base * GROUP_PAD + rows) * 2 + 1, l)


@triton.jit
def _decode_merge_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, stride_ob, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    m_all = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    for split in range(NUM_SPLITS):
        base = (seq * num_kv_heads + kv_head) * NUM_SPLITS + split
        m_all = tl.maximum(m_all, tl.load(part_ml_ptr + (base * GROUP_PAD + rows) * 2))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_all = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for split in range(NUM_SPLITS):
        base = (seq * num_kv_heads + kv_head) * NUM_SPLITS + split
        m = tl.load(part_ml_ptr + (base * GROUP_PAD + rows) * 2)
        l = tl.load(part_ml_ptr + (base * GROUP_PAD + rows) * 2 + 1)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
        l_all += l * w
        acc += tl.load(part_acc_ptr + (base * GROUP_PAD + rows[:, None]) * HEAD_DIM + dims[None, :]) * w[:, None]
    out = acc / tl.maximum(l_all, 1e-30)[:, None]
    heads = kv_head * GROUP + rows
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=(rows < GROUP)[:, None])


def pick_num_splits(max_context: int, split_target: int = 512, max_splits: int = 16) -> int:
    """How many context ranges to split a decode into, for contexts up to max_context tokens."""
    return max(1, min(max_splits, -(-max_context // split_target)))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           num_splits: int = 1, max_context: int | None = None,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q [B, heads, head_dim] over cached contexts; caches [blocks, block_size, kv_heads, head_dim]
    (e4m3 caches with their per-KV-head scales k_scale, v_scale [kv_heads] float32).

    block_tables [B, max_blocks] and context_lens [B] are integer tensors on q's device.
    max_context bounds every context (default: the table width), so each split covers
    ceil(max_context / num_splits) tokens; all launch parameters are then fixed, so
    the call can be captured in a CUDA graph.
    """
    batch, num_heads, head_dim = q.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    group_pad = max(16, triton.next_power_of_2(group))
    max_blocks = block_tables.shape[1]
    max_context = max_context or max_blocks * block_size
    split_len = -(-max_context // num_splits)
    tile = 64 if head_dim <= 128 else 32
    part_acc = torch.empty((batch, kv_heads, num_splits, group_pad, head_dim), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((batch, kv_heads, num_splits, group_pad, 2), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, part_acc, part_ml,
        k_scale if fp8 else part_ml, v_scale if fp8 else part_ml,
        scale, max_blocks, split_len,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, TILE=tile,
        NUM_SPLITS=num_splits, KV_FP8=fp8,
    )
    _decode_merge_kernel[(batch, kv_heads)](
        part_acc, part_ml, out, out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
    )
    return out
