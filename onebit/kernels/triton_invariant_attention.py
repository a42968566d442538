"""Batch-invariant Triton attention over the paged KV cache (`--deterministic`): a query token's
result is the same bits whether it is a decode step, a row of a speculative verification or a
token of a prefill chunk, and whatever else shares the step. Reference:
`batch_invariant.attention_rows_ref`.

The context is cut into splits of a fixed length (a multiple of the key tile, fixed per engine,
never chosen by the step) and each split into key tiles at fixed offsets. A program takes one
query tile (TQ tokens of one sequence, each with all the query heads of one KV head: ROWS =
TQ x GROUP_PAD rows, at least 16 for `tl.dot`), one KV head and one split; it runs an online
softmax over the split's key tiles, masking keys after each row's own position, and stores the
split's (max, sum, accumulator) per row. A second kernel merges the splits of each token in
split order. A decode row is a tile with one token: the same ROWS, the same dots, the same
split and tile boundaries as a prefill token at that position, so the arithmetic is identical:
the extra keys a prefill tile visits are masked to exact zeros for earlier rows, and a split
that a row does not reach contributes exact zeros to its merge.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels.triton_invariant_matmul import DOT_FP32


def key_tile(head_dim: int) -> int:
    """Keys per inner step."""
    return 64 if head_dim <= 128 else 32


def tile_shape(group: int) -> tuple[int, int]:
    """(GROUP_PAD, TQ): query heads per token padded to a power of two, and tokens per tile so
    that a tile has at least 16 rows."""
    group_pad = triton.next_power_of_2(group)
    return group_pad, max(16 // group_pad, 1)


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, tile_table_ptr, tile_row_ptr, tile_n_ptr, tile_ctx_ptr,
                  part_acc_ptr, part_ml_ptr, scale, max_blocks, split_len, num_splits,
                  stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, TQ: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                  DOT_FP32: tl.constexpr):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    table_row = tl.load(tile_table_ptr + tile)
    row0 = tl.load(tile_row_ptr + tile)  # the tile's first packed token
    n = tl.load(tile_n_ptr + tile)  # its number of tokens
    ctx = tl.load(tile_ctx_ptr + tile)  # context length through its last token

    rows = tl.arange(0, TQ * GROUP_PAD)
    tok = rows // GROUP_PAD
    g = rows % GROUP_PAD
    row_ok = (tok < n) & (g < GROUP)
    pos = ctx - n + tok  # each row's absolute position
    dims = tl.arange(0, HEAD_DIM)
    q_off = (row0 + tok).to(tl.int64) * stride_qt + (kv_head * GROUP + g) * stride_qh
    q = tl.load(q_ptr + q_off[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)
    if DOT_FP32:  # the CPU interpreter (see triton_invariant_matmul)
        q = q.to(tl.float32)

    m = tl.full([TQ * GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([TQ * GROUP_PAD], tl.float32)
    acc = tl.zeros([TQ * GROUP_PAD, HEAD_DIM], tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)
    table = tables_ptr + table_row.to(tl.int64) * max_blocks
    for t0 in range(start, end, TILE):
        keys = t0 + tl.arange(0, TILE)
        key_ok = keys < end
        blocks = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0)
        offs = blocks.to(tl.int64) * stride_kb + (keys % BLOCK_SIZE) * stride_kt + kv_head * stride_kh
        k = tl.load(k_ptr + offs[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + offs[:, None] + dims[None, :], mask=key_ok[:, None], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        s = tl.where((keys[None, :] <= pos[:, None]) & key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        p_v = p.to(v.dtype)
        if DOT_FP32:
            p_v, v = p_v.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p_v, v).to(tl.float32)
        m = m_new

    # partials are indexed by packed token: [T, kv_heads, num_splits, GROUP_PAD, (HEAD_DIM | 2)]
    base = ((row0 + tok).to(tl.int64) * num_kv_heads + kv_head) * num_splits + split
    tl.store(part_acc_ptr + (base * GROUP_PAD + g)[:, None] * HEAD_DIM + dims[None, :], acc,
             mask=row_ok[:, None])
    tl.store(part_ml_ptr + (base * GROUP_PAD + g) * 2, m, mask=row_ok)
    tl.store(part_ml_ptr + (base * GROUP_PAD + g) * 2 + 1, l, mask=row_ok)


@triton.jit
def _merge_kernel(part_acc_ptr, part_ml_ptr, out_ptr, num_splits, stride_ot, stride_oh,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    g = tl.arange(0, GROUP_PAD)
    g_ok = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    first = (token * num_kv_heads + kv_head) * num_splits
    m_all = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    for split in range(0, num_splits):
        m_all = tl.maximum(m_all, tl.load(part_ml_ptr + ((first + split) * GROUP_PAD + g) * 2, mask=g_ok,
                                          other=float("-inf")))
    m_safe = tl.where(m_all == float("-inf"), 0.0, m_all)
    l_all = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for split in range(0, num_splits):
        at = (first + split) * GROUP_PAD + g
        m = tl.load(part_ml_ptr + at * 2, mask=g_ok, other=float("-inf"))
        l = tl.load(part_ml_ptr + at * 2 + 1, mask=g_ok, other=0.0)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_safe))
        l_all += l * w
        acc += tl.load(part_acc_ptr + at[:, None] * HEAD_DIM + dims[None, :], mask=g_ok[:, None], other=0.0) * w[:, None]
    out = acc / tl.maximum(l_all, 1e-30)[:, None]
    heads = kv_head * GROUP + g
    tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


def packed(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tiles, scale: float, split_len: int,
           num_splits: int) -> torch.Tensor:
    """Attention for every token of a packed step q [T, heads, head_dim] over `tiles` (from
    `plan_tiles` or `decode_tiles`; every packed token in exactly one tile), with KV splits of
    split_len keys (a multiple of `key_tile`), num_splits of them (enough for the longest context)."""
    tables, table_rows, firsts, counts, ctx = tiles
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    group_pad, tq = tile_shape(group)
    part_acc = torch.empty((num_tokens, kv_heads, num_splits, group_pad, head_dim), dtype=torch.float32,
                           device=q.device)
    part_ml = torch.empty((num_tokens, kv_heads, num_splits, group_pad, 2), dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _split_kernel[(firsts.shape[0], kv_heads, num_splits)](
        q, k_cache, v_cache, tables, table_rows, firsts, counts, ctx, part_acc, part_ml,
        scale, tables.shape[1], split_len, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, GROUP_PAD=group_pad, TQ=tq, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        TILE=key_tile(head_dim), DOT_FP32=DOT_FP32)
    _merge_kernel[(num_tokens, kv_heads)](part_acc, part_ml, out, num_splits, out.stride(0), out.stride(1),
                                          GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim)
    return out


def decode_tiles(block_tables: torch.Tensor, context_lens: torch.Tensor):
    """Tiles of a step of decode rows (one token each, table row i for row i), made on the device
    without a host round trip, so a CUDA graph can capture them."""
    rows = torch.arange(block_tables.shape[0], device=block_tables.device, dtype=torch.int32)
    return block_tables, rows, rows, torch.ones_like(rows), context_lens.to(torch.int32)


def plan_tiles(meta, group: int, tables: torch.Tensor):
    """(tables, table row, first packed token, tokens, context through the last token) per tile
    of a packed step: one tile per decode row, TQ-token tiles over each prefill chunk."""
    _, tq = tile_shape(group)
    d = meta.num_decodes
    table_rows, firsts, counts = list(range(d)), list(range(d)), [1] * d
    ends = []
    for j, (start, n, ctx) in enumerate(meta.prefills):
        for q0 in range(0, n, tq):
            table_rows.append(d + j)
            firsts.append(start + q0)
            counts.append(min(tq, n - q0))
            ends.append(ctx - n + q0 + counts[-1])
    dev = tables.device
    as_t = lambda xs: torch.tensor(xs, dtype=torch.int32).to(dev, non_blocking=True)  # noqa: E731
    ctx = as_t(ends)
    if d:
        ctx = torch.cat([meta.decode_context_lens.to(torch.int32), ctx])
    return tables, as_t(table_rows), as_t(firsts), as_t(counts), ctx

