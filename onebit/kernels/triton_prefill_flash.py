"""Triton flash-attention prefill over the paged KV cache: causal, GQA, tensor-core dots.

The successor of `triton_prefill` (kept as the baseline the device bench compares against) with
the same contract: packed query chunks, each the last n tokens of its sequence's context, read
K/V straight from the cache through the block table (no dense gather). What changed:

- bigger tiles: a program takes `rows` (token, query head) rows of one KV head (GQA: the heads
  of a group share every K/V load), 128 by default instead of 64, with 8 warps;
- the causal mask only where it can cut: keys before the tile's first position are visible to
  every row, so the loop over them has no masks and no bounds checks; only the key tiles from
  there to the tile's last position (the diagonal) are masked;
- the longest tiles first: programs are ordered by how many keys they read, so the last wave
  of a long prompt is not its longest tiles running alone;
- the per-tile metadata (sequence, first query) is built and uploaded once per step
  (`plan_tiles`, cached on the step's metadata by `attention.paged_attention`), not once per layer.

Reference: `onebit.kernels.attention.prefill_attention_ref`; runs under TRITON_INTERPRET=1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from onebit.kernels.triton_decode import sm_count
from onebit.kernels import kv_fp8, triton_prefill
from onebit.kernels.triton_prefill import _key_step, _query_tile, _write_tile

# The engine's switch: False routes prefill chunks to the older `triton_prefill` kernel (benches
# compare the two with it). On since session 11: on the H200 (8B shape) one layer is 1.13-1.23x
# the older kernel (2k and 8k prompts, four 2k packed, a 512 chunk at 8k), and the engine's
# prefill of 1 / 8 / 32 2k prompts took 0.05 / 0.43 / 1.77 s against 0.05 / 0.44 / 1.80 s, the
# same on a first and a second pass (session 10's 1.12 s against 0.44 s did not come back).
enabled = True


@dataclass(frozen=True)
class PrefillLaunch:
    """Tile shape of a launch: rows (query token x head pairs) per program, keys per inner step,
    warps and software-pipeline stages."""

    rows: int = 128
    tile_k: int = 64
    warps: int = 8
    stages: int = 3


DEFAULT_LAUNCH = PrefillLaunch()
# With many programs (tiles x KV heads: a long prompt, or several) 4 warps a program did better,
# with few 8 (G27, session 11, H200, 8B shape, one layer, ms, 8 warps against 4: an 8k prompt
# 2.19 / 1.92 and four 2k prompts 0.61 / 0.55 at 2,048 programs; one 2k prompt 0.19 / 0.21 at 512;
# a 512-token chunk at 8k 0.30 / 0.46 at 128). Same rows and key tile: the same tile plan.
MANY_PROGRAMS_LAUNCH = PrefillLaunch(128, 64, 4, 3)
MANY_PROGRAMS_PER_SM = 8
# Candidates the device bench times (bench/gpu_attention_long.py).
CANDIDATES = [PrefillLaunch(64, 64, 4, 3), PrefillLaunch(128, 64, 4, 3), PrefillLaunch(128, 64, 8, 3),
              PrefillLaunch(128, 32, 8, 3), PrefillLaunch(128, 128, 8, 2), PrefillLaunch(256, 64, 8, 2)]


@triton.jit(do_not_specialize=["max_blocks"])  # the table width changes every step: one variant
def _flash_prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tiles_ptr, seqs_ptr, tables_ptr, k_scale_ptr, v_scale_ptr, scale, max_blocks,
    stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_ot, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, TQ: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_K: tl.constexpr, KV_FP8: tl.constexpr, DOT_F16: tl.constexpr = False,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tiles_ptr + tile * 2)  # tiles: (sequence, first query offset) pairs
    q0 = tl.load(tiles_ptr + tile * 2 + 1)
    start = tl.load(seqs_ptr + seq * 3)  # seqs: (query start, query length, context length) triples
    qlen = tl.load(seqs_ptr + seq * 3 + 1)
    ctx = tl.load(seqs_ptr + seq * 3 + 2)

    tok, g, row_ok, pos, dims, q, scale = _query_tile(q_ptr, k_scale_ptr, scale, q0, start, qlen, ctx, kv_head,
                                                      stride_qt, stride_qh, GROUP, GROUP_PAD, TQ, HEAD_DIM, KV_FP8,
                                                      DOT_F16)

    m = tl.full([TQ * GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([TQ * GROUP_PAD], tl.float32)
    acc = tl.zeros([TQ * GROUP_PAD, HEAD_DIM], tl.float32)
    first_pos = ctx - qlen + q0  # the tile's first position: every row sees all keys before it
    kv_end = tl.minimum(ctx, first_pos + TQ)  # one past the tile's last position
    open_end = first_pos // TILE_K * TILE_K
    table = tables_ptr + seq.to(tl.int64) * max_blocks
    for k0 in range(0, open_end, TILE_K):
        m, l, acc = _key_step(q, k_ptr, v_ptr, table, k0, kv_head, m, l, acc, pos, kv_end, scale,
                              stride_kb, stride_kt, stride_kh, dims, HEAD_DIM, BLOCK_SIZE, TILE_K, False, KV_FP8)
    for k0 in range(open_end, kv_end, TILE_K):
        m, l, acc = _key_step(q, k_ptr, v_ptr, table, k0, kv_head, m, l, acc, pos, kv_end, scale,
                              stride_kb, stride_kt, stride_kh, dims, HEAD_DIM, BLOCK_SIZE, TILE_K, True, KV_FP8)
    _write_tile(out_ptr, v_scale_ptr, acc, l, start, tok, g, row_ok, dims, kv_head, stride_ot, stride_oh, GROUP, KV_FP8)


def tokens_per_tile(num_heads: int, num_kv_heads: int, rows: int) -> int:
    """Query tokens one program takes so that tokens x (group padded to a power of two) = rows."""
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    return max(rows // group_pad, 1)


@dataclass
class TilePlan:
    """One step's prefill tiles on the device: `tiles` [n, 2] int32 (sequence, first query offset),
    longest first; `seqs` [S, 3] int32 (query start, query length, context length); and the
    tokens per tile they were cut for."""

    tiles: torch.Tensor
    seqs: torch.Tensor
    tq: int


def tile_order(query_lens: list[int], context_lens: list[int], tq: int) -> list[tuple[int, int]]:
    """(sequence, first query offset) of every tile covering the chunks, ordered by the keys each
    reads (its last position + 1), longest first; ties keep sequence order."""
    tiles = []
    for i, (n, ctx) in enumerate(zip(query_lens, context_lens)):
        for q0 in range(0, n, tq):
            tiles.append((min(ctx, ctx - n + q0 + tq), i, q0))
    tiles.sort(key=lambda t: -t[0])
    return [(i, q0) for _, i, q0 in tiles]


def plan_tiles(query_starts: list[int], query_lens: list[int], context_lens: list[int], num_heads: int,
               num_kv_heads: int, device: torch.device, launch: PrefillLaunch = DEFAULT_LAUNCH) -> TilePlan:
    """Cut the step's chunks into tiles and upload the plan (two small host-to-device copies)."""
    tq = tokens_per_tile(num_heads, num_kv_heads, launch.rows)
    order = tile_order(query_lens, context_lens, tq)
    tiles = torch.tensor(order or [(0, 0)], dtype=torch.int32)[:len(order)]
    seqs = torch.tensor(list(zip(query_starts, query_lens, context_lens)) or [(0, 0, 0)], dtype=torch.int32)
    return TilePlan(tiles.to(device, non_blocking=True), seqs.to(device, non_blocking=True), tq)


def launch_for(plan: TilePlan, kv_heads: int, sms: int) -> PrefillLaunch:
    """The launch for a step's tile plan (made with DEFAULT_LAUNCH's rows): 4 warps a program
    when there are at least MANY_PROGRAMS_PER_SM programs per SM, else the default's 8."""
    programs = plan.tiles.shape[0] * kv_heads
    return MANY_PROGRAMS_LAUNCH if programs >= MANY_PROGRAMS_PER_SM * sms else DEFAULT_LAUNCH


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            query_starts: list[int], query_lens: list[int], context_lens: list[int],
                            block_tables: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                            launch: PrefillLaunch | None = None, plan: TilePlan | None = None) -> torch.Tensor:
    """Causal attention for packed query chunks q [T, heads, head_dim] over their paged contexts
    (e4m3 caches with their per-KV-head scales k_scale, v_scale [kv_heads] float32); the contract
    of `triton_prefill.paged_prefill_attention`. `plan` (from `plan_tiles` with the same launch)
    saves rebuilding the tiles when several layers run the same step. `launch` None: DEFAULT_LAUNCH's
    tiles, with the warps `launch_for` picks for their number.
    """
    _, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    plan = plan or plan_tiles(query_starts, query_lens, context_lens, num_heads, kv_heads, q.device,
                              launch or DEFAULT_LAUNCH)
    out = torch.empty_like(q) if out is None else out
    if plan.tiles.shape[0] == 0:
        return out
    if launch is None:
        launch = launch_for(plan, kv_heads, sm_count(q.device))
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    tile_k = launch.tile_k if head_dim <= 128 else min(launch.tile_k, 32)  # registers of wide heads
    _flash_prefill_kernel[(plan.tiles.shape[0], kv_heads)](
        q, k_cache, v_cache, out, plan.tiles, plan.seqs, block_tables, k_scale if fp8 else q, v_scale if fp8 else q,
        scale, block_tables.shape[1],
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), TQ=plan.tq, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, TILE_K=tile_k, KV_FP8=fp8,
        DOT_F16=kv_fp8.float16_products(fp8, q.dtype, triton_prefill.FP8_DOT_F16),
        num_warps=launch.warps, num_stages=launch.stages,
    )
    return out
