"""Triton kernels for FP8 (e4m3) weights with one scale per output column: a split-K weight-only
product for few rows, and a one-pass per-token quantizer feeding `torch._scaled_mm` for many.

`split_k`: decoding reads every weight once per step, so the kernel's job is to keep enough
bytes in flight. The first weight-only kernel (`triton_fp8`) ran one program per 32 output
columns, 128-192 programs for the 4096- and 6144-wide products on 132 SMs, and streamed e4m3 at
1.6-2.7 TB/s. Here the grid is (row tiles, column tiles, SPLIT slices of K): each program walks
its K slice in BLOCK_K tiles of whole weight rows (K contiguous, so each thread loads 16
consecutive bytes), widens them in registers and accumulates in float32, with an elementwise
product and a row sum for one row (BLOCK_M == 1) and `tl.dot` for more. With SPLIT == 1 the
program scales its columns and writes the result; otherwise it writes an unscaled float32
partial, and the SPLIT partials of each output are summed in a fixed order (deterministic), the
column scale applied once and the bias added, by a reduce kernel (`triton_split_k`). Given e4m3 rows quantized per
token (`quantize_rows`, their scales beside), the tensor-core tiles multiply e4m3 by e4m3 (w8a8,
the numbers `_scaled_mm` gives) instead of widening the weight.

`quantize_rows`: the activations' per-token quantization (amax, scale, divide, cast) in one
program per row instead of a chain of torch ops, each a launch of its own. `quantize_row_blocks`: the
same per row and block of K values, one program a block, for the split-K kernel's per-block x scales.

References: `onebit.kernels.fp8.weight_only_ref`, `fp8.quantize_rows`, `fp8.quantize_row_blocks` and
`fp8.w8a8_blocks_ref`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.triton_activations import silu_times
from onebit.kernels.triton_split_k import reduce_partials

FP8_MAX = tl.constexpr(448.0)  # a constexpr: the kernels may read it
# `_to_e4m3` rounds in float32 arithmetic (`_round_to_e4m3`) so that the final cast is exact, for Triton's
# interpreter, whose cast drops a carry. On the GPU the cast rounds to nearest even itself (sm_90:
# cvt.rn.satfinite.e4m3x2.f32, two values an instruction), so with HARDWARE_E4M3_ROUNDING the compiled
# kernels leave the rounding to it: the same values for fewer instructions (bit for bit on the H200, session
# 34; no speed change measured alone, shipped with the 16 warps below, which were measured with it).
HARDWARE_E4M3_ROUNDING = True
_CAST_ROUNDS = tl.constexpr(HARDWARE_E4M3_ROUNDING and os.environ.get("TRITON_INTERPRET", "0") != "1")
# The row quantizers' warps at a 4,096-value block: 8 (4 lost 0.5-0.8 us a launch, session 33's call 7), and
# 16 (8 values a thread) from SIXTEEN_WARPS_FROM rows: FP8 B=64 +2.9% and +3.1% on one H200 (session 34,
# two A/Bs); at 8 and 32 rows no gain inside the spread, so those keep 8.
SIXTEEN_WARP_ROWS = True
SIXTEEN_WARPS_FROM = 64
MAX_ROWS = 256  # beyond this the tensor-core product is the only sensible candidate
# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, num_warps). BLOCK_M is 1 (one row, no tl.dot) or 16/32/64.
# One row, SPLIT 1 with 4 or 8 columns a program and 2,048-value K tiles (session 27 on the H200): every
# 8B product took one of the two at one row (qkv 9.6 -> 8.6 us, o 7.0 -> 6.7, gate_up 26.5 -> 25.7, down
# 15.3 -> 15.1, head 138 -> 136) over the split picks before, whose 144 sum launches a step went with
# them: FP8 B=1 367 -> 380 tok/s. Also timed then and never picked: (1, 8, 1024, 1, 4), (1, 4, 4096, 1, 8),
# (1, 8, 512, 1, 2).
ONE_ROW_CONFIGS = [(1, 4, 2048, 1, 4), (1, 8, 2048, 1, 8),
                   (1, 16, 512, 1, 4), (1, 16, 512, 4, 4), (1, 32, 256, 4, 4), (1, 16, 1024, 2, 4),
                   (1, 32, 512, 2, 4), (1, 64, 256, 4, 8), (1, 16, 256, 8, 4), (1, 8, 1024, 4, 4)]
FEW_ROW_CONFIGS = [(16, 16, 512, 1, 4), (16, 16, 512, 4, 4), (16, 32, 256, 4, 4), (16, 32, 512, 2, 4),
                   (16, 64, 256, 4, 4), (16, 64, 256, 2, 8), (16, 16, 256, 8, 4), (16, 32, 256, 8, 4)]
MANY_ROW_CONFIGS = [(32, 32, 256, 4, 4), (32, 64, 256, 2, 4), (64, 32, 128, 2, 4), (64, 64, 128, 2, 4),
                    (64, 32, 256, 4, 4), (64, 64, 128, 4, 4), (64, 64, 256, 4, 8), (64, 128, 128, 1, 8),
                    (64, 128, 128, 4, 8)]

# For e4m3 rows (w8a8, X_FP8): an e4m3 K tile is half the bytes of a bf16 one, so longer K tiles.
# Row tiles of 64 or 128 (one warp group per 64 rows): Hopper's e4m3 tensor-core instruction
# (wgmma) takes 64 rows; a smaller tile compiles to the older instruction, which on sm_90 widens
# both operands to fp16 first. Fewer rows than the tile are masked. Unmeasured: calibration times
# them against the rest.
W8A8_CONFIGS = [(64, 64, 256, 2, 4), (64, 64, 256, 4, 4), (64, 32, 256, 4, 4), (64, 128, 128, 2, 4),
                (64, 128, 256, 1, 8), (64, 64, 512, 2, 4), (128, 64, 128, 1, 8)]
# From 32 rows, a sixth element: the pipeline's stages (3 otherwise, Triton's default). Deeper pipelines
# and wider column tiles keep more of the weight in flight per SM (session 13: at 64 rows the w8a8 tiles
# streamed 1.5-2.8 TB/s of the 4.24).
# Session 22 on the H200: these four took 32-256 rows of every 8B product shape from the older configs
# (FP8 B=32 +3.8%, B=64 +3.6% in an alternating A/B); (64, 128, 128, 2, 4, 5), (64, 256, 128, 1, 8, 3),
# (64, 64, 512, 1, 4, 3) and (64, 128, 256, 2, 8, 3) were never picked and were dropped (each candidate
# adds to the start-up calibration).
W8A8_DEEP_CONFIGS = [(64, 64, 256, 1, 4, 4), (64, 128, 128, 1, 4, 4), (64, 64, 128, 2, 4, 6), (64, 128, 256, 1, 8, 4)]
# Session 26 timed three wider tiles with a split of 4, (64, 128, 256, 4, 8, 4), (64, 128, 128, 4, 4, 6)
# and (64, 256, 128, 4, 8, 4), meant to cut the x traffic from L2 of 64-column tiles: no product of the
# 8B shape picked one at 32 or 64 rows, and they were dropped.
DEEP_FROM_ROWS = 32


@triton.jit
def _tile_block_scales(s_ptr, rn, n_ok, k0, K, stride_sn, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr):
    # The scale of each output column rn for a K tile starting at k0 that lies in one block column
    # (0 past K: an empty slice; `rn * 0 + k0` makes the mask a vector, as the interpreter wants).
    return tl.load(s_ptr + tl.where(n_ok, rn // SCALE_BN, 0) * stride_sn + k0 // SCALE_BK,
                   mask=n_ok & (rn * 0 + k0 < K), other=0.0)


@triton.jit
def _block_scaled_tile(prod, s_ptr, rn, n_ok, k0, K, stride_sn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr):
    # prod [BLOCK_N, BLOCK_K]: one row's products with a K tile starting at k0; summed per block
    # column, each sum times its block's scale. Returns [BLOCK_N].
    if BLOCK_K <= SCALE_BK:
        return tl.sum(prod, axis=1) * _tile_block_scales(s_ptr, rn, n_ok, k0, K, stride_sn, SCALE_BN, SCALE_BK)
    else:
        s_rows = s_ptr + tl.where(n_ok, rn // SCALE_BN, 0) * stride_sn
        parts = tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // SCALE_BK, SCALE_BK)), axis=2)
        cols = k0 // SCALE_BK + tl.arange(0, BLOCK_K // SCALE_BK)
        s = tl.load(s_rows[:, None] + cols[None, :], mask=n_ok[:, None] & (cols * SCALE_BK < K)[None, :], other=0.0)
        return tl.sum(parts * s, axis=1)


@triton.jit
def _one_row_weights(w_rows, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    # [BLOCK_N, BLOCK_K] e4m3 weights of the K tile at k0 (zeros past K)
    rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        w = tl.load(w_rows + rk[None, :], eviction_policy="evict_first")
    else:
        w = tl.load(w_rows + rk[None, :], mask=(rk < K)[None, :], other=0.0, eviction_policy="evict_first")
    return w


@triton.jit
def _one_row_x(x_row, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    # [BLOCK_K] float32 values of the row's K tile at k0 (zeros past K)
    rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        x = tl.load(x_row + rk).to(tl.float32)
    else:
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)
    return x


@triton.jit
def _one_row_tile(w, x, s_ptr, rn, n_ok, k0, K, stride_sn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr):
    # One row's [BLOCK_N] sums over the K tile at k0 (x, `_one_row_x`) of the weights w, block-scaled where
    # SCALE_BN > 0
    # (if / else, not an early return: the compiler builds what follows a constexpr branch's return)
    if SCALE_BN == 0:
        sums = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    else:  # BLOCK_K is a whole number of block columns (or one divides it the other way)
        sums = _block_scaled_tile(w.to(tl.float32) * x[None, :], s_ptr, rn, n_ok, k0, K, stride_sn,
                                  BLOCK_N, BLOCK_K, SCALE_BN, SCALE_BK)
    return sums


@triton.jit
def _one_row_weight_tiles(w_rows, up_rows, k0, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, GATED: tl.constexpr):
    # The K tile at k0 of the weight rows and, GATED, of the up rows below them (else the first again,
    # not loaded twice)
    w = _one_row_weights(w_rows, k0, K, BLOCK_K, EVEN_K)
    if GATED:
        w_up = _one_row_weights(up_rows, k0, K, BLOCK_K, EVEN_K)
    else:
        w_up = w
    return w, w_up


@triton.jit
def _one_row_add(acc, acc_up, w, w_up, x_row, s_ptr, rn, n_ok, k0, K, stride_sn, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                 GATED: tl.constexpr):
    # acc (and, GATED, acc_up) plus the K tile at k0 of x times w (w_up), as `_one_row_weight_tiles` gave them
    x = _one_row_x(x_row, k0, K, BLOCK_K, EVEN_K)
    acc += _one_row_tile(w, x, s_ptr, rn, n_ok, k0, K, stride_sn, BLOCK_N, BLOCK_K, SCALE_BN, SCALE_BK)
    if GATED:
        acc_up += _one_row_tile(w_up, x, s_ptr, rn, n_ok, k0, K, stride_sn, BLOCK_N, BLOCK_K, 0, 0)
    return acc, acc_up


@triton.jit
def _split_k_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_om,
                    stride_split, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr = False,
                    SCALE_BN: tl.constexpr = 0, SCALE_BK: tl.constexpr = 0, stride_sn=0,
                    X_FP8: tl.constexpr = False, xs_ptr=None, XS_BK: tl.constexpr = 0, stride_xsm=0,
                    EARLY: tl.constexpr = False, GATED: tl.constexpr = False):
    # SPLIT > 1: out_ptr is the [SPLIT, M, N] float32 partials (`triton_split_k.reduce_partials` sums them).
    # X_FP8 (tensor-core tiles only, per-column scales): x holds e4m3 rows quantized per token with
    # one scale each at xs_ptr; the tiles multiply e4m3 by e4m3 as loaded (no widening of the
    # weight in registers on the way to the tensor cores) and each row's sum takes its scale at
    # the end, before the column scale. XS_BK > 0: one scale per row and block of XS_BK values of K
    # (`quantize_row_blocks`, xs [M, ceil(K / XS_BK)], a row's stride stride_xsm); BLOCK_K divides XS_BK, so
    # each K tile lies in one block and its product takes that block's scale before it is added.
    # SCALE_BN == 0: one scale per output column, applied once at the end (here, or by the reduce).
    # Else a block-scaled weight (as FP8 checkpoints are published): the scale of weight (n, k) is
    # s[n // SCALE_BN, k // SCALE_BK], applied to each block column's partial sum as it is made,
    # so the partials and the output need no scale after.
    # EARLY (one row, `pdl.early_weights`): the slice's first weight tile is loaded before the wait for the
    # previous kernel, whose tail it may overlap (no kernel of a step writes a weight); the rest waits first.
    # GATED (one row, SPLIT 1, per-column scales): the weight is an MLP's [gate | up] (2N rows, N the
    # output's width); each program sums gate rows rn and up rows N + rn over the same x loads and stores
    # silu(gate) * up (`silu_times`, the bits of the product followed by `triton_fused.silu_mul`).
    # Row tiles vary fastest: programs sharing a weight tile run together, so it is read from HBM once.
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    # Columns past N read row 0 instead of masking: the weight loads stay unmasked and vectorized;
    # those columns are never stored.
    w_rows = w_ptr + tl.where(n_ok, rn, 0).to(tl.int64)[:, None] * stride_wn
    k_begin = pid_k * K_PER_SPLIT
    if BLOCK_M == 1:
        x_row = x_ptr + pid_m * stride_xm
        up_rows = w_rows + N.to(tl.int64) * stride_wn  # GATED: the up half's rows
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
        loop_begin = k_begin
        if EARLY:  # the first tile's weights, then the wait, then its x
            w, w_up = _one_row_weight_tiles(w_rows, up_rows, k_begin, K, BLOCK_K, EVEN_K, GATED)
            pdl.wait_for_previous(PDL)
            acc, acc_up = _one_row_add(acc, acc_up, w, w_up, x_row, s_ptr, rn, n_ok, k_begin, K, stride_sn, BLOCK_N,
                                       BLOCK_K, EVEN_K, SCALE_BN, SCALE_BK, GATED)
            loop_begin = k_begin + BLOCK_K
        else:
            pdl.wait_for_previous(PDL)
        for k0 in range(loop_begin, k_begin + K_PER_SPLIT, BLOCK_K):
            w, w_up = _one_row_weight_tiles(w_rows, up_rows, k0, K, BLOCK_K, EVEN_K, GATED)
            acc, acc_up = _one_row_add(acc, acc_up, w, w_up, x_row, s_ptr, rn, n_ok, k0, K, stride_sn, BLOCK_N,
                                       BLOCK_K, EVEN_K, SCALE_BN, SCALE_BK, GATED)
        out = out_ptr + pid_m * stride_om + rn
        if SPLIT == 1:
            if SCALE_BN == 0:
                acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
            if GATED:
                acc_up = acc_up * tl.load(s_ptr + N + rn, mask=n_ok, other=0.0)
                if HAS_BIAS:
                    acc_up += tl.load(b_ptr + N + rn, mask=n_ok, other=0.0).to(tl.float32)
                dtype = out_ptr.dtype.element_ty
                tl.store(out, silu_times(acc.to(dtype), acc_up.to(dtype)), mask=n_ok)
            else:
                tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok)
        else:
            tl.store(out + pid_k * stride_split, acc, mask=n_ok)
    else:
        pdl.wait_for_previous(PDL)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = rm < M
        x_rows = x_ptr + rm[:, None] * stride_xm
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_begin, k_begin + K_PER_SPLIT, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            if EVEN_K:
                x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None], other=0.0)
                w = tl.load(w_rows + rk[None, :], eviction_policy="evict_first")
            else:
                x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & (rk < K)[None, :], other=0.0)
                w = tl.load(w_rows + rk[None, :], mask=(rk < K)[None, :], other=0.0, eviction_policy="evict_first")
            if X_FP8 and XS_BK > 0:
                xs = tl.load(xs_ptr + rm * stride_xsm + k0 // XS_BK, mask=m_ok & (rm * 0 + k0 < K), other=0.0)
                acc += tl.dot(x, tl.trans(w)) * xs[:, None]
            elif X_FP8:
                acc = tl.dot(x, tl.trans(w), acc)
            elif SCALE_BN == 0:
                acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
            else:  # BLOCK_K divides SCALE_BK: the tile lies in one block column
                s = _tile_block_scales(s_ptr, rn, n_ok, k0, K, stride_sn, SCALE_BN, SCALE_BK)
                acc += tl.dot(x, tl.trans(w.to(x.dtype))) * s[None, :]
        if X_FP8 and XS_BK == 0:
            acc = acc * tl.load(xs_ptr + rm, mask=m_ok, other=0.0)[:, None]
        out = out_ptr + rm[:, None] * stride_om + rn[None, :]
        out_ok = m_ok[:, None] & n_ok[None, :]
        if SPLIT == 1:
            if SCALE_BN == 0:
                acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
            if HAS_BIAS:
                acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=out_ok)
        else:
            tl.store(out + pid_k * stride_split, acc, mask=out_ok)


def split_k(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
            config: tuple[int, int, int, int, int], block: tuple[int, int] | None = None,
            x_scale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
            x_block: int = 0) -> torch.Tensor:
    """x [M, K] (unit column stride) @ (q [N, K] e4m3 * scale [N]).T + bias, in x's dtype.

    config is (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, num_warps[, num_stages]); BLOCK_M 1 walks the rows one program
    each without tensor cores, otherwise row tiles of BLOCK_M (at least 16) go through `tl.dot`.
    With `block` (bn, bk), scale is [ceil(N/bn), ceil(K/bk)] float32, one per weight block; BLOCK_K
    must divide bk, or (one row) be a multiple of it. With `x_scale` [M] float32, x is e4m3 rows
    quantized per token (`quantize_rows`) and the tiles multiply in e4m3 (w8a8; tensor-core tiles
    and per-column scales only); the result is in `out_dtype`. With `x_block` as well, x_scale is
    [M, ceil(K / x_block)], one scale per row and block of x_block values (`quantize_row_blocks`; BLOCK_K
    must divide x_block)."""
    block_m, block_n, block_k, split, warps, *stages = config
    pipeline = {"num_stages": stages[0]} if stages else {}
    m, n, k = x.shape[0], q.shape[0], q.shape[1]
    if m > MAX_ROWS:
        raise ValueError(f"split_k takes at most {MAX_ROWS} rows, got {m}")
    scale_bn, scale_bk = block or (0, 0)
    if block is not None and not (scale_bk % block_k == 0 or (block_m == 1 and block_k % scale_bk == 0)):
        raise ValueError(f"weight block {block} and K tile {block_k} do not fit (config {config})")
    blocks = {"SCALE_BN": scale_bn, "SCALE_BK": scale_bk, "stride_sn": scale.stride(0)} if block else {}
    if x_scale is not None:
        if block is not None or block_m == 1 or out_dtype is None:
            raise ValueError("e4m3 rows take tensor-core tiles (BLOCK_M >= 16), per-column scales and an out_dtype")
        blocks = {"X_FP8": True, "xs_ptr": x_scale}
        if x_block:
            if x_block % block_k or x_scale.dim() != 2 or x_scale.shape != (m, triton.cdiv(k, x_block)):
                raise ValueError(f"x scales {tuple(x_scale.shape)} per {x_block} values do not fit x [{m}, {k}] "
                                 f"and K tile {block_k}")
            blocks.update(XS_BK=x_block, stride_xsm=x_scale.stride(0))
    # Each slice a whole number of BLOCK_K tiles; the last slices may run past K (masked) or be empty.
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    even_k = k_per_split * split == k
    y = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    b_arg = bias if bias is not None else scale
    if split == 1:
        _split_k_kernel[grid](x, q, scale, b_arg, y, m, n, k, k_per_split, x.stride(0), q.stride(0), y.stride(0), 0,
                              HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                              SPLIT=1, EVEN_K=even_k, num_warps=warps, **pipeline, **blocks, **pdl.options(),
                              EARLY=block_m == 1 and pdl.early_weights())
        return y
    partial = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _split_k_kernel[grid](x, q, scale, b_arg, partial, m, n, k, k_per_split, x.stride(0), q.stride(0), n, m * n,
                          HAS_BIAS=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split,
                          EVEN_K=even_k, num_warps=warps, **pipeline, **blocks, **pdl.options(),
                          EARLY=block_m == 1 and pdl.early_weights())
    reduce_partials(partial, scale if block is None else None, bias, y)
    return y


def split_k_silu_mul(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                     config: tuple[int, int, int, int, int]) -> torch.Tensor:
    """silu(gate) * up for one row x [1, K] and an MLP's [gate | up] weight q [2 I, K] (scale [2 I], bias
    [2 I] or None) in one launch: bit for bit `split_k` with this config followed by `triton_fused.silu_mul`.
    The config must be a one-row one without a split (BLOCK_M 1, SPLIT 1); returns [1, I] in x's dtype."""
    block_m, block_n, block_k, split, warps, *stages = config
    if x.shape[0] != 1 or block_m != 1 or split != 1 or q.shape[0] % 2:
        raise ValueError(f"SiLU * mul fused takes one row, a one-row config without a split and an even number "
                         f"of weight rows; got {x.shape[0]} row(s), config {config}, weight {tuple(q.shape)}")
    n, k = q.shape[0] // 2, q.shape[1]
    k_per_split = triton.cdiv(k, block_k) * block_k
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _split_k_kernel[(1, triton.cdiv(n, block_n), 1)](
        x, q, scale, bias if bias is not None else scale, y, 1, n, k, k_per_split, x.stride(0), q.stride(0),
        y.stride(0), 0, HAS_BIAS=bias is not None, BLOCK_M=1, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=1,
        EVEN_K=k_per_split == k, num_warps=warps, **({"num_stages": stages[0]} if stages else {}), **pdl.options(),
        EARLY=pdl.early_weights(), GATED=True)
    return y


def candidates(rows: int) -> list[tuple[int, int, int, int, int]]:
    """The split_k configs worth timing for this many rows."""
    if rows == 1:
        return ONE_ROW_CONFIGS + FEW_ROW_CONFIGS[:2]
    if rows <= 16:
        return FEW_ROW_CONFIGS
    return MANY_ROW_CONFIGS if rows <= MAX_ROWS else []


def w8a8_candidates(rows: int) -> list[tuple[int, ...]]:
    """The split_k configs worth timing for this many e4m3 rows (none below 16 rows: one or a few
    rows read the weight faster than quantizing them pays)."""
    if rows < 16 or rows > MAX_ROWS:
        return []
    deep = W8A8_DEEP_CONFIGS if rows >= DEEP_FROM_ROWS else []
    return [c for c in W8A8_CONFIGS + deep if c[0] == 64 or rows > 64]


def default_config(rows: int) -> tuple[int, int, int, int, int]:
    """The config used for a row count nothing was calibrated for."""
    if rows == 1:
        return ONE_ROW_CONFIGS[0]
    if rows <= 16:
        return FEW_ROW_CONFIGS[1]
    return MANY_ROW_CONFIGS[0] if rows <= 32 else MANY_ROW_CONFIGS[2]


@triton.jit
def _round_to_e4m3(v):
    # v (float32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, as float32. Done in
    # float32 arithmetic so the final cast is exact: Triton's interpreter (the CPU tests) drops the
    # carry when a cast rounds up into the next power of two (124.7 became 64, not 128).
    exponent = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    # 3 mantissa bits: a step of 2^(e-3) within [2^e, 2^(e+1)); the subnormals share 2^-9.
    step_exponent = tl.maximum(exponent, -6) - 3
    step = ((step_exponent + 127) << 23).to(tl.float32, bitcast=True)
    scaled = v * ((127 - step_exponent) << 23).to(tl.float32, bitcast=True)  # v / step, exact; |scaled| <= 16
    rounded = (scaled + 12582912.0) - 12582912.0  # 1.5 * 2^23: float32 addition rounds to an integer, ties to even
    return tl.where(rounded == 0, v * 0.0, rounded * step)  # keeps the sign of a zero, as torch's cast does


@triton.jit
def _e4m3_scale(amax):
    # The scale that maps a block whose largest magnitude is amax onto e4m3's range: IEEE division
    # (`div_rn`), as torch's references divide.
    return tl.math.div_rn(tl.maximum(amax, 1e-12), FP8_MAX)


@triton.jit
def _to_e4m3(v, scale):
    # v / scale clamped to e4m3's range and rounded to its nearest value (float32, cast exactly after); with
    # _CAST_ROUNDS the caller's cast to e4m3 does the rounding.
    q = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -FP8_MAX), FP8_MAX)
    if _CAST_ROUNDS:
        return q
    return _round_to_e4m3(q)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, BLOCK_K: tl.constexpr,
                          PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        amax = tl.maximum(amax, tl.abs(tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)))
    scale = _e4m3_scale(tl.max(amax, axis=0))
    tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):  # the second read of the row comes from the cache
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)
        q = _to_e4m3(x, scale)
        tl.store(q_ptr + row * stride_qm + rk, q.to(q_ptr.dtype.element_ty), mask=rk < K)


def row_warps(block: int, rows: int) -> int:
    """The warps of a one-program-a-row quantizer whose block holds `block` values, over `rows` rows."""
    if block < 4096:
        return 4
    return 16 if SIXTEEN_WARP_ROWS and rows >= SIXTEEN_WARPS_FROM else 8


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, K] e4m3, scale [M, 1] float32) with x ~= q * scale, one scale per row (token)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block_k = min(triton.next_power_of_2(k), 4096)
    _quantize_rows_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), BLOCK_K=block_k,
                                num_warps=row_warps(block_k, m), **pdl.options())
    return q, scale


@triton.jit
def _quantize_row_blocks_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, BLOCK: tl.constexpr,
                            PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row, block = tl.program_id(0), tl.program_id(1)
    rk = block * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_xm + rk, mask=rk < K, other=0.0).to(tl.float32)
    scale = _e4m3_scale(tl.max(tl.abs(x), axis=0))
    tl.store(s_ptr + row * stride_sm + block, scale)
    tl.store(q_ptr + row * stride_qm + rk, _to_e4m3(x, scale).to(q_ptr.dtype.element_ty), mask=rk < K)


def quantize_row_blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, K] e4m3, scale [M, ceil(K / block)] float32) with x ~= q * scale of its block: one scale
    per row and block of `block` values (a power of two), one program each, so a row's values are
    read once and no program walks a whole row (`quantize_rows` does, twice)."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((m, triton.cdiv(k, block)), dtype=torch.float32, device=x.device)
    _quantize_row_blocks_kernel[(m, scale.shape[1])](x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0),
                                                 BLOCK=block, num_warps=4 if block >= 1024 else 2, **pdl.options())
    return q, scale
