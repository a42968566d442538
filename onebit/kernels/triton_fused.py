"""Triton kernels for the per-token work between the matrix products.

Each replaces several small torch launches with one: add + RMSNorm, SiLU * mul, and
(q/k norm + RoPE + KV-cache write). References live in `onebit.kernels.fused_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.triton_activations import silu_times
from onebit.kernels.triton_decode import sm_count

# add + RMSNorm runs one program a row on Triton's default 4 warps (32 values a thread at 4,096 columns). With
# WIDE_NORM_ROWS, 16 warps from 64 rows, as the FP8 row quantizers (`triton_fp8_fast.SIXTEEN_WARP_ROWS`: FP8 B=64
# +3% in three A/Bs, session 34); the bf16 norms are 72 launches of ~2.1 us in a 64-row step. Off until measured.
WIDE_NORM_ROWS = False


@triton.jit
def _norm_weight_then_wait(w_ptr, cols, ok, PDL: tl.constexpr, EARLY: tl.constexpr):
    # A norm kernel's start: its weight `w_ptr[cols]` and the wait for the previous kernel, the weight
    # loaded first with EARLY (`pdl.early_weights`: no kernel of a step writes a weight).
    if EARLY:
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
        pdl.wait_for_previous(PDL)
    else:
        pdl.wait_for_previous(PDL)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    return w


@triton.jit
def _add_rms_norm_row(x_ptr, res_ptr, w, res_out_ptr, row, cols, ok, n_cols, eps, HAS_RESIDUAL: tl.constexpr):
    # One row of rms_norm(x [+ residual]) * w (the weight's values at cols) in x's dtype (x + residual stored
    # to res_out_ptr first); triton_fp8_fused quantizes this same value.
    x = tl.load(x_ptr + row * n_cols + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * n_cols + cols, mask=ok, other=0.0)
        tl.store(res_out_ptr + row * n_cols + cols, x, mask=ok)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(x.dtype)
    return (w.to(tl.float32) * normed.to(tl.float32)).to(x.dtype)


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, n_cols, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                         EARLY: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    w = _norm_weight_then_wait(w_ptr, cols, ok, PDL, EARLY)
    out = _add_rms_norm_row(x_ptr, res_ptr, w, res_out_ptr, row, cols, ok, n_cols, eps, HAS_RESIDUAL)
    tl.store(out_ptr + row * n_cols + cols, out, mask=ok)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """rms_norm(x [+ residual]) over rows of a contiguous [T, D] x; returns (out, x + residual or None)."""
    rows, cols = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    block = triton.next_power_of_2(cols)
    wide = WIDE_NORM_ROWS and rows >= 64 and block >= 4096
    _add_rms_norm_kernel[(rows,)](x, residual if residual is not None else x, weight, out, res_out, cols, eps,
                                  HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=16 if wide else 4,
                                  EARLY=pdl.early_weights(), **pdl.options())
    return out, (res_out if residual is not None else None)


@triton.jit
def _silu_mul_row(gu_row, cols, ok, n_cols):
    # silu(gate) * up at `cols` of one [2 I] gate_up row, each step rounded to the input's dtype;
    # triton_fp8_fused quantizes this same value.
    gate = tl.load(gu_row + cols, mask=ok, other=0.0)
    up = tl.load(gu_row + n_cols + cols, mask=ok, other=0.0)
    return silu_times(gate, up)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    tl.store(out_ptr + row * n_cols + cols, _silu_mul_row(gu_ptr + row * 2 * n_cols, cols, ok, n_cols), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for a contiguous [T, 2 I] gate_up; returns [T, I]."""
    rows, width = gate_up.shape
    n = width // 2
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](gate_up, out, n, BLOCK=block, **pdl.options())
    return out


@triton.jit
def _e4m3_value(x, inv_scale):
    # x / scale saturated to e4m3's range and rounded (to nearest) to its 4 significant bits in fp32
    # (Veltkamp's split), so the store's conversion is exact: Triton's interpreter drops the carry
    # when its own fp32 -> e4m3 conversion rounds up (127 became 64), the GPU's does not.
    y = tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0)
    c = y * 1048577.0  # 2**20 + 1
    return c - (c - y)


@triton.jit
def _store_cache_heads(cache_ptr, scale_ptr, slot, kv_head, ok, a, b, lo, NUM_KV: tl.constexpr,
                       HEAD_DIM: tl.constexpr, KV_FP8: tl.constexpr):
    # Halves a, b [heads, HEAD_DIM / 2] of the heads where `ok` into the cache at `slot`, heads
    # kv_head; an e4m3 cache gets value / its head's scale, saturated.
    dst = cache_ptr + (slot * NUM_KV + kv_head)[:, None] * HEAD_DIM
    if KV_FP8:
        inv = (1.0 / tl.load(scale_ptr + kv_head, mask=ok, other=1.0))[:, None]
        a, b = _e4m3_value(a, inv), _e4m3_value(b, inv)
    tl.store(dst + lo, a.to(cache_ptr.dtype.element_ty), mask=ok[:, None])
    tl.store(dst + HEAD_DIM // 2 + lo, b.to(cache_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _qk_norm_rope_store_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, slot_ptr,
                               q_out_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, eps, qkv_stride,
                               NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                               HAS_NORM: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr = False,
                               HEADS: tl.constexpr = 1):
    pdl.wait_for_previous(PDL)
    # One token's heads HEADS at a time: 0..H-1 query heads, H..H+KV-1 key heads, then value
    # heads. Every head of the tile goes through the same arithmetic and the stores pick, per head,
    # where it goes (masks instead of branches, so a tile may mix kinds).
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    live = head < NUM_HEADS + 2 * NUM_KV
    is_q = head < NUM_HEADS
    is_k = (head >= NUM_HEADS) & (head < NUM_HEADS + NUM_KV)
    is_v = live & (head >= NUM_HEADS + NUM_KV)
    half = HEAD_DIM // 2
    lo = tl.arange(0, HEAD_DIM // 2)[None, :]
    base = qkv_ptr + tok * qkv_stride + tl.where(live, head, 0)[:, None] * HEAD_DIM
    x1 = tl.load(base + lo, mask=live[:, None], other=0.0)
    x2 = tl.load(base + half + lo, mask=live[:, None], other=0.0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # value heads: straight to the cache
    _store_cache_heads(v_cache_ptr, v_scale_ptr, slot, tl.where(is_v, head - NUM_HEADS - NUM_KV, 0), is_v, x1, x2,
                       lo, NUM_KV, HEAD_DIM, KV_FP8)
    # query and key heads: RMSNorm over the head (with HAS_NORM), then rotary
    y1, y2 = x1, x2
    if HAS_NORM:
        w1 = tl.where(is_q[:, None], tl.load(qn_ptr + lo), tl.load(kn_ptr + lo)).to(tl.float32)
        w2 = tl.where(is_q[:, None], tl.load(qn_ptr + half + lo), tl.load(kn_ptr + half + lo)).to(tl.float32)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        rstd = 1.0 / tl.sqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / HEAD_DIM + eps)
        n1, n2 = (f1 * rstd[:, None]).to(x1.dtype), (f2 * rstd[:, None]).to(x1.dtype)
        y1 = (w1 * n1.to(tl.float32)).to(x1.dtype)
        y2 = (w2 * n2.to(tl.float32)).to(x1.dtype)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    c = tl.load(cos_ptr + pos * HEAD_DIM + lo)
    s = tl.load(sin_ptr + pos * HEAD_DIM + lo)
    g1, g2 = y1.to(tl.float32), y2.to(tl.float32)
    o1 = (g1 * c - g2 * s).to(x1.dtype)
    o2 = (g2 * c + g1 * s).to(x1.dtype)
    q_dst = q_out_ptr + (tok * NUM_HEADS + tl.where(is_q, head, 0))[:, None] * HEAD_DIM
    tl.store(q_dst + lo, o1, mask=is_q[:, None])
    tl.store(q_dst + half + lo, o2, mask=is_q[:, None])
    # (an e4m3 key is rounded to the model dtype first, as the reference does)
    _store_cache_heads(k_cache_ptr, k_scale_ptr, slot, tl.where(is_k, head - NUM_HEADS, 0), is_k, o1, o2,
                       lo, NUM_KV, HEAD_DIM, KV_FP8)


def heads_per_program(tokens: int, heads: int, sms: int) -> int:
    """How many heads one program of the fused q/k/v write takes on a device of `sms`
    multiprocessors (`triton_decode.sm_count`): one while tokens x heads programs are few (decoding
    a few rows: more programs, more loads in flight), doubling (up to 16) while at least 4 programs
    per multiprocessor remain (many rows: 256 tokens x 48 heads made 12,288 programs of 128 values
    each)."""
    per_program, floor = 1, 4 * sms
    while per_program < 16 and per_program * 2 <= heads and tokens * triton.cdiv(heads, per_program * 2) >= floor:
        per_program *= 2
    return per_program


def tokens_per_heads_choice(heads: int, sms: int, max_tokens: int = 4096) -> list[int]:
    """For each heads-per-program count `heads_per_program` gives over 1..max_tokens tokens, the
    fewest tokens that get it, ascending: one step per kernel variant a warm-up must compile."""
    first: dict[int, int] = {}
    for tokens in range(1, max_tokens + 1):
        first.setdefault(heads_per_program(tokens, heads, sms), tokens)
    return sorted(first.values())


def qk_norm_rope_store(qkv, positions, cos, sin, q_norm, k_norm, eps, slot_mapping, k_cache, v_cache,
                       num_heads, num_kv_heads, head_dim, k_scale=None, v_scale=None, heads_per_prog=None):
    """Fused form of `fused_ref.qk_norm_rope_store_ref`; caches must be contiguous [blocks, block_size, KV, D]
    (e4m3 ones with k_scale and v_scale [KV] float32). heads_per_prog: heads a program takes (a power
    of two; default `heads_per_program`'s rule)."""
    t = qkv.shape[0]
    q = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    has_norm = q_norm is not None
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    total = num_heads + 2 * num_kv_heads
    per_program = heads_per_prog or heads_per_program(t, total, sm_count(qkv.device))
    _qk_norm_rope_store_kernel[(t, triton.cdiv(total, per_program))](
        qkv, positions, cos, sin, q_norm if has_norm else qkv, k_norm if has_norm else qkv, slot_mapping,
        q, k_cache, v_cache, k_scale if fp8 else cos, v_scale if fp8 else cos, eps, qkv.stride(0),
        NUM_HEADS=num_heads, NUM_KV=num_kv_heads, HEAD_DIM=head_dim, HAS_NORM=has_norm, KV_FP8=fp8,
        HEADS=per_program, **pdl.options())
    return q
