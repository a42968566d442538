"""Triton varlen attention over the paged KV cache for prefill chunks (any query length).

Queries of a step are packed; each sequence's chunk is cut into tiles of TQ tokens. One
program handles one tile and one KV head, with all the query heads of that head's group as
rows (GQA: K/V read once per group), and walks the sequence's context through its block
table with an online softmax, masking keys after each row's own position. Cached prefixes
and earlier chunks are just context, so prefix-cache hits and chunked prefill need nothing
special. Reference: `onebit.kernels.attention.prefill_attention_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import kv_fp8


@triton.jit
def _query_tile(q_ptr, k_scale_ptr, scale, q0, start, qlen, ctx, kv_head, stride_qt, stride_qh,
                GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, TQ: tl.constexpr, HEAD_DIM: tl.constexpr,
                KV_FP8: tl.constexpr, DOT_F16: tl.constexpr = False):
    """A tile's rows (TQ tokens from q0 x the KV head's GROUP query heads): their token offsets, head
    indices, validity, absolute positions, the head dims, the loaded queries and the score scale
    (K's head scale folded in for an e4m3 cache). DOT_F16: the queries in float16, so that
    `_key_step` converts e4m3 keys and values to float16 (`kv_fp8.float16_products`)."""
    rows = tl.arange(0, TQ * GROUP_PAD)
    tok = q0 + rows // GROUP_PAD
    g = rows % GROUP_PAD
    row_ok = (tok < qlen) & (g < GROUP)
    pos = ctx - qlen + tok  # absolute position of each row's token
    dims = tl.arange(0, HEAD_DIM)
    q_off = (start + tok).to(tl.int64) * stride_qt + (kv_head * GROUP + g) * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
    if KV_FP8:  # e4m3 entries: K's head scale folds into the score scale, V's into the output
        scale = scale * tl.load(k_scale_ptr + kv_head)
    if DOT_F16:
        q = q.to(tl.float16)
    return tok, g, row_ok, pos, dims, q, scale


@triton.jit
def _key_step(q, k_ptr, v_ptr, table, k0, kv_head, m, l, acc, pos, kv_end, scale,
              stride_kb, stride_kt, stride_kh, dims, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
              TILE_K: tl.constexpr, MASKED: tl.constexpr, KV_FP8: tl.constexpr):
    """One key tile of the online softmax: (m, l, acc) updated with keys k0 .. k0 + TILE_K."""
    keys = k0 + tl.arange(0, TILE_K)
    if MASKED:
        key_ok = keys < kv_end
        blocks = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0)
    else:
        blocks = tl.load(table + keys // BLOCK_SIZE)
    offs = blocks.to(tl.int64) * stride_kb + (keys % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
    if MASKED:
        k = tl.load(k_ptr + offs[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + offs[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + offs[:, None] + dims[None, :])
        v = tl.load(v_ptr + offs[:, None] + dims[None, :])
    if KV_FP8:
        k, v = k.to(q.dtype), v.to(q.dtype)
    s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
    if MASKED:
        s = tl.where((keys[None, :] <= pos[:, None]) & key_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return m_new, l, acc


@triton.jit
def _write_tile(out_ptr, v_scale_ptr, acc, l, start, tok, g, row_ok, dims, kv_head, stride_ot, stride_oh,
                GROUP: tl.constexpr, KV_FP8: tl.constexpr):
    """Normalize a tile's online-softmax sums and store its valid rows (V's head scale applied)."""
    if KV_FP8:
        acc = acc * tl.load(v_scale_ptr + kv_head)
    out = acc / tl.maximum(l, 1e-30)[:, None]
    o_off = (start + tok).to(tl.int64) * stride_ot + (kv_head * GROUP + g) * stride_oh
    tl.store(out_ptr + o_off[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["max_blocks"])  # the table width changes every step: one variant
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tile_seq_ptr, tile_q0_ptr, seq_start_ptr, seq_qlen_ptr, seq_ctx_ptr,
    tables_ptr, k_scale_ptr, v_scale_ptr, scale, max_blocks,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, TQ: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_K: tl.constexpr, KV_FP8: tl.constexpr, DOT_F16: tl.constexpr = False,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    start = tl.load(seq_start_ptr + seq)
    qlen = tl.load(seq_qlen_ptr + seq)
    ctx = tl.load(seq_ctx_ptr + seq)

    tok, g, row_ok, pos, dims, q, scale = _query_tile(q_ptr, k_scale_ptr, scale, q0, start, qlen, ctx, kv_head,
                                                      stride_qt, stride_qh, GROUP, GROUP_PAD, TQ, HEAD_DIM, KV_FP8,
                                                      DOT_F16)

    m = tl.full([TQ * GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([TQ * GROUP_PAD], tl.float32)
    acc = tl.zeros([TQ * GROUP_PAD, HEAD_DIM], tl.float32)
    kv_end = tl.minimum(ctx, ctx - qlen + q0 + TQ)  # one past the tile's last position
    table = tables_ptr + seq.to(tl.int64) * max_blocks
    for k0 in range(0, kv_end, TILE_K):
        m, l, acc = _key_step(q, k_ptr, v_ptr, table, k0, kv_head, m, l, acc, pos, kv_end, scale,
                              stride_kb, stride_kt, stride_kh, dims, HEAD_DIM, BLOCK_SIZE, TILE_K, True, KV_FP8)
    _write_tile(out_ptr, v_scale_ptr, acc, l, start, tok, g, row_ok, dims, kv_head, stride_ot, stride_oh, GROUP, KV_FP8)


def tokens_per_tile(num_heads: int, num_kv_heads: int) -> int:
    """Query tokens one program takes: about 64 rows of (token, head) pairs."""
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    return max(64 // group_pad, 1)


def prefill_tiles(query_lens: list[int], tq: int) -> tuple[list[int], list[int]]:
    """(sequence index, first query offset) of every tile covering the given chunks."""
    seqs, starts = [], []
    for i, n in enumerate(query_lens):
        for q0 in range(0, n, tq):
            seqs.append(i)
            starts.append(q0)
    return seqs, starts


# An e4m3 cache's products in float16, as the decode kernel's (`triton_decode.FP8_DOT_F16`). A prefill
# tile spreads each key's conversion over TQ x the group's query rows, so it gains less than decode:
# session 17 (G34 --prefill, one layer, flash kernel) 1.09x at a 2k prompt, 1.11x for a 512 chunk at
# 8k, 0.99-1.00x at an 8k prompt and 4 x 2k (prediction 0-10%); relative error against the bfloat16
# products 2.1-2.5e-3, the e4m3 rounding's own scale being 3.8e-2.
FP8_DOT_F16 = True


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_starts: list[int], query_lens: list[int], context_lens: list[int],
                            block_tables: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention for packed query chunks q [T, heads, head_dim] over their paged contexts
    (e4m3 caches with their per-KV-head scales k_scale, v_scale [kv_heads] float32).

    Sequence i's queries are q[query_starts[i] : + query_lens[i]], the last query_lens[i] of its
    context_lens[i] tokens; block_tables [S, max_blocks]. Rows of `out` outside the chunks are
    left untouched.
    """
    _, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    tq = tokens_per_tile(num_heads, kv_heads)
    tile_seq, tile_q0 = prefill_tiles(query_lens, tq)
    out = torch.empty_like(q) if out is None else out
    if not tile_seq:
        return out
    dev = q.device
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int32).to(dev, non_blocking=True)  # noqa: E731
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    _prefill_kernel[(len(tile_seq), kv_heads)](
        q, k_cache, v_cache, out, as_t(tile_seq), as_t(tile_q0), as_t(query_starts), as_t(query_lens),
        as_t(context_lens), block_tables, k_scale if fp8 else q, v_scale if fp8 else q, scale, block_tables.shape[1],
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), TQ=tq, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE_K=64 if head_dim <= 128 else 32, KV_FP8=fp8,
        DOT_F16=kv_fp8.float16_products(fp8, q.dtype, FP8_DOT_F16),
    )
    return out
