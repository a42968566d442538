"""Triton products with GGUF-packed weights (Q8_0, Q4_K, Q5_K, Q6_K): dequantize in registers, multiply.

A weight is a `gguf_quants.PackedMatrix`: per row, its blocks' quant bytes, scale bytes and f16
super-scales in three arrays. Each program owns BLOCK_N weight rows and BLOCK_M activation rows
and walks K one step at a time (256 values for the K-quants, one super-block; 128 for Q8_0):
it loads the step's packed bytes of its rows once, contiguously, decodes the scales once per
sub-block, expands the quants into two [BLOCK_N, 128] float tiles in the order the bytes hold
them (low and high nibbles: no shuffling of weights), and multiplies each with the activations
gathered at the matching columns (`tl.dot`, fp32 accumulation). The activations are tiny and
cached; the weights, the bytes that set the time, are read once per row tile.
- up to MAX_KERNEL_ROWS = 16 rows (decoding): one row tile of 16, narrow BLOCK_N for enough programs
  (64-row tiles ran out of shared memory on the H200; they wait for a tuned launch);
- more rows (prefill chunks, large batches): the weight is expanded to bf16 by `dequantize` (same tile code,
  stored instead of multiplied) and multiplied by cuBLAS; the expansion is one pass over the
  weight, small next to a product of hundreds of rows.
Reference: `onebit.kernels.gguf_quants.packed_linear_ref`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_KERNEL_ROWS = 16  # the 64-row tile ran out of shared memory on the H200 (413,696 > 232,448 bytes)
QTYPE_IDS = {"Q8_0": 0, "Q4_K": 1, "Q5_K": 2, "Q6_K": 3}
STEP = {"Q8_0": 128, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
# (BLOCK_N, UNROLL steps per loop turn, num_warps). Unmeasured guesses until bench/gpu_gguf_quant.py
# times them: BLOCK_N 16 gives 256 programs for the 4096-row products of the 8B shape (2 per SM).
FEW_ROWS_CONFIG = (16, 2, 4)  # 1-4 rows
DEFAULT_CONFIG = (32, 2, 4)  # 5-16 rows: wider tiles reload the activations fewer times
MANY_ROWS_CONFIG = (64, 1, 4)
CONFIGS = [(16, 1, 4), (16, 2, 4), (16, 4, 4), (32, 1, 4), (32, 2, 4), (64, 1, 4), (64, 2, 8)]


@triton.jit
def _small_int_to_float(q, offset: tl.constexpr):
    """float(q - offset) for int32 0 <= q < 2**23 without an int->float conversion (a quarter-rate
    instruction on the GPU): q's bits under the exponent of 2**23, minus 2**23 + offset (exact)."""
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + offset)


@triton.jit
def _q8_0_step(q_ptr, d_ptr, rn, n_ok, stride_qn, stride_dn, step, BLOCK_N: tl.constexpr):
    """Values [step*128, step*128 + 128) of rows rn: four blocks of 32 int8 times their f16 scale."""
    g = tl.arange(0, 4)
    lane = tl.arange(0, 32)
    rows = rn[:, None, None].to(tl.int64)
    q = tl.load(q_ptr + rows * stride_qn + step * 128 + g[None, :, None] * 32 + lane[None, None, :],
                mask=n_ok[:, None, None], other=0)
    d = tl.load(d_ptr + rn[:, None].to(tl.int64) * stride_dn + step * 4 + g[None, :], mask=n_ok[:, None], other=0.0)
    w = _small_int_to_float(q.to(tl.int32) + 128, 128) * d.to(tl.float32)[:, :, None]
    return tl.reshape(w, (BLOCK_N, 128)), step * 128 + tl.arange(0, 128)


@triton.jit
def _k4_scale_min(sbase, mask, j):
    """The 6-bit (scale, min) of sub-blocks j [4] from a Q4_K/Q5_K block's 12 scale bytes at sbase [BN, 1]."""
    a = tl.load(sbase + j[None, :], mask=mask, other=0).to(tl.int32)
    b = tl.load(sbase + j[None, :] + 4, mask=mask, other=0).to(tl.int32)
    e = tl.load(sbase + (j % 4)[None, :], mask=mask, other=0).to(tl.int32)
    first = j[None, :] < 4
    sc = tl.where(first, a & 63, (b & 15) | ((e >> 6) << 4))
    mn = tl.where(first, b & 63, (b >> 4) | ((a >> 6) << 4))
    return sc.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _k4_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, blk,
             FIFTH_BIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Super-block blk of rows rn (Q4_K, or Q5_K with FIFTH_BIT): tiles of the low and the high
    nibbles [BN, 128] and their columns: byte 32c + l holds values 64c + l (low) and 64c + 32 + l."""
    c = tl.arange(0, 4)
    lane = tl.arange(0, 32)
    rows = rn[:, None, None].to(tl.int64)
    mask3 = n_ok[:, None, None]
    QBYTES: tl.constexpr = 160 if FIFTH_BIT else 128
    base = q_ptr + rows * stride_qn + blk * QBYTES
    qs = tl.load(base + (QBYTES - 128) + c[None, :, None] * 32 + lane[None, None, :], mask=mask3, other=0)
    lo = (qs & 15).to(tl.int32)
    hi = (qs >> 4).to(tl.int32)
    if FIFTH_BIT:  # bit s of byte l of the 32-byte qh is the fifth bit of sub-block s's value l
        qh = tl.load(base + lane[None, None, :], mask=mask3, other=0).to(tl.int32)
        lo = lo | (((qh >> (2 * c)[None, :, None]) & 1) << 4)
        hi = hi | (((qh >> (2 * c + 1)[None, :, None]) & 1) << 4)
    sbase = s_ptr + rn[:, None].to(tl.int64) * stride_sn + blk * 12
    sc_lo, mn_lo = _k4_scale_min(sbase, n_ok[:, None], 2 * c)
    sc_hi, mn_hi = _k4_scale_min(sbase, n_ok[:, None], 2 * c + 1)
    dbase = d_ptr + rn[:, None].to(tl.int64) * stride_dn + blk * 2
    d = tl.load(dbase, mask=n_ok[:, None], other=0.0).to(tl.float32)
    dmin = tl.load(dbase + 1, mask=n_ok[:, None], other=0.0).to(tl.float32)
    w_lo = (d * sc_lo)[:, :, None] * _small_int_to_float(lo, 0) - (dmin * mn_lo)[:, :, None]
    w_hi = (d * sc_hi)[:, :, None] * _small_int_to_float(hi, 0) - (dmin * mn_hi)[:, :, None]
    t = tl.arange(0, 128)
    col = blk * 256 + (t // 32) * 64 + t % 32
    return tl.reshape(w_lo, (BLOCK_N, 128)), col, tl.reshape(w_hi, (BLOCK_N, 128)), col + 32


@triton.jit
def _q6_k_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, blk, BLOCK_N: tl.constexpr):
    """Super-block blk of rows rn (Q6_K): tiles of the values built on low and on high nibbles.

    Byte G*16 + r of ql (G = 4h + g) holds values 128h + 16g + r (low) and 128h + 64 + 16g + r
    (high); their top two bits are in qh[32h + 16(g % 2) + r] at bits 2(g // 2) and 4 + 2(g // 2)."""
    grp = tl.arange(0, 8)
    lane = tl.arange(0, 16)
    rows = rn[:, None, None].to(tl.int64)
    mask3 = n_ok[:, None, None]
    base = q_ptr + rows * stride_qn + blk * 192
    ql = tl.load(base + grp[None, :, None] * 16 + lane[None, None, :], mask=mask3, other=0).to(tl.int32)
    half, g = grp // 4, grp % 4
    qh = tl.load(base + 128 + (half * 32 + (g % 2) * 16)[None, :, None] + lane[None, None, :],
                 mask=mask3, other=0).to(tl.int32)
    shift = (2 * (g // 2))[None, :, None]
    q_lo = (ql & 15) | (((qh >> shift) & 3) << 4)  # 0..63, the value + 32
    q_hi = (ql >> 4) | (((qh >> (shift + 4)) & 3) << 4)
    sbase = s_ptr + rn[:, None].to(tl.int64) * stride_sn + blk * 16
    sc_lo = tl.load(sbase + (8 * half + g)[None, :], mask=n_ok[:, None], other=0).to(tl.float32)
    sc_hi = tl.load(sbase + (8 * half + g + 4)[None, :], mask=n_ok[:, None], other=0).to(tl.float32)
    d = tl.load(d_ptr + rn[:, None].to(tl.int64) * stride_dn + blk, mask=n_ok[:, None], other=0.0).to(tl.float32)
    w_lo = (d * sc_lo)[:, :, None] * _small_int_to_float(q_lo, 32)
    w_hi = (d * sc_hi)[:, :, None] * _small_int_to_float(q_hi, 32)
    t = tl.arange(0, 128)
    col = blk * 256 + (t // 64) * 128 + t % 64
    return tl.reshape(w_lo, (BLOCK_N, 128)), col, tl.reshape(w_hi, (BLOCK_N, 128)), col + 64


@triton.jit
def _x_tile(x_ptr, rm, m_ok, stride_xm, col):
    """Activations [BM, 128] at columns col."""
    return tl.load(x_ptr + rm[:, None] * stride_xm + col[None, :], mask=m_ok[:, None], other=0.0)


@triton.jit
def _step_product(acc, x_ptr, rm, m_ok, stride_xm, q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn,
                  stride_dn, step, QTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc + x[:, step's columns] @ (the step's dequantized weight tile).T"""
    if QTYPE == 0:
        w, col = _q8_0_step(q_ptr, d_ptr, rn, n_ok, stride_qn, stride_dn, step, BLOCK_N)
        x = _x_tile(x_ptr, rm, m_ok, stride_xm, col)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    else:
        if QTYPE == 3:
            w_a, col_a, w_b, col_b = _q6_k_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn,
                                                step, BLOCK_N)
        else:
            w_a, col_a, w_b, col_b = _k4_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn,
                                              step, QTYPE == 2, BLOCK_N)
        x_a = _x_tile(x_ptr, rm, m_ok, stride_xm, col_a)
        acc = tl.dot(x_a, tl.trans(w_a.to(x_a.dtype)), acc)
        x_b = _x_tile(x_ptr, rm, m_ok, stride_xm, col_b)
        acc = tl.dot(x_b, tl.trans(w_b.to(x_b.dtype)), acc)
    return acc


@triton.jit
def _matmul_kernel(x_ptr, q_ptr, s_ptr, d_ptr, y_ptr, M, N, STEPS, stride_xm, stride_qn, stride_sn, stride_dn,
                   stride_ym, QTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   UNROLL: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s0 in range(0, STEPS, UNROLL):  # STEPS is a multiple of UNROLL (the launcher sees to it)
        for u in tl.static_range(UNROLL):
            acc = _step_product(acc, x_ptr, rm, m_ok, stride_xm, q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn,
                                stride_sn, stride_dn, s0 + u, QTYPE, BLOCK_N)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _dequantize_kernel(q_ptr, s_ptr, d_ptr, w_ptr, N, stride_qn, stride_sn, stride_dn, stride_wn,
                       QTYPE: tl.constexpr, BLOCK_N: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    step = tl.program_id(1)
    rows = rn[:, None].to(tl.int64) * stride_wn
    if QTYPE == 0:
        w, col = _q8_0_step(q_ptr, d_ptr, rn, n_ok, stride_qn, stride_dn, step, BLOCK_N)
        tl.store(w_ptr + rows + col[None, :], w.to(w_ptr.dtype.element_ty), mask=n_ok[:, None])
    else:
        if QTYPE == 3:
            w_a, col_a, w_b, col_b = _q6_k_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn,
                                                step, BLOCK_N)
        else:
            w_a, col_a, w_b, col_b = _k4_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn,
                                              step, QTYPE == 2, BLOCK_N)
        tl.store(w_ptr + rows + col_a[None, :], w_a.to(w_ptr.dtype.element_ty), mask=n_ok[:, None])
        tl.store(w_ptr + rows + col_b[None, :], w_b.to(w_ptr.dtype.element_ty), mask=n_ok[:, None])


def _operands(weight):
    """The three arrays as the kernels read them (Q8_0's quants as int8, Q6_K's scales as int8)."""
    quants = weight.quants.view(torch.int8) if weight.qtype == "Q8_0" else weight.quants
    scales = weight.scales.view(torch.int8) if weight.qtype == "Q6_K" else weight.scales
    if scales.numel() == 0:
        scales = weight.d  # never read (Q8_0 has no sub-block scales); any valid pointer
    return quants, scales, weight.d


def dequantize(weight, dtype: torch.dtype = torch.bfloat16, block_n: int = 32) -> torch.Tensor:
    """The PackedMatrix `weight` as a dense [rows, cols] tensor of `dtype`, on its device."""
    quants, scales, d = _operands(weight)
    out = torch.empty(weight.rows, weight.cols, dtype=dtype, device=quants.device)
    steps = weight.cols // STEP[weight.qtype]
    _dequantize_kernel[(triton.cdiv(weight.rows, block_n), steps)](
        quants, scales, d, out, weight.rows, quants.stride(0), scales.stride(0), d.stride(0), out.stride(0),
        QTYPE=QTYPE_IDS[weight.qtype], BLOCK_N=block_n, num_warps=4)
    return out


def matmul(x: torch.Tensor, weight, out: torch.Tensor | None = None,
           config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] @ weight.T into out [M, rows] (a fresh tensor when None; a column slice of a wider
    output is fine: unit column stride). Above MAX_KERNEL_ROWS rows: dequantize, then cuBLAS."""
    m, k = x.shape
    if k != weight.cols:
        raise ValueError(f"x has {k} columns, the weight {weight.cols}")
    if out is None:
        out = torch.empty(m, weight.rows, dtype=x.dtype, device=x.device)
    if m > MAX_KERNEL_ROWS:
        return out.copy_(F.linear(x, dequantize(weight, x.dtype)))
    x = x.contiguous()
    block_n, unroll, warps = config or (FEW_ROWS_CONFIG if m <= 4 else DEFAULT_CONFIG if m <= 16 else MANY_ROWS_CONFIG)
    block_m = 16
    steps = weight.cols // STEP[weight.qtype]
    while steps % unroll:
        unroll //= 2
    quants, scales, d = _operands(weight)
    _matmul_kernel[(triton.cdiv(weight.rows, block_n), triton.cdiv(m, block_m))](
        x, quants, scales, d, out, m, weight.rows, steps, x.stride(0), quants.stride(0), scales.stride(0),
        d.stride(0), out.stride(0), QTYPE=QTYPE_IDS[weight.qtype], BLOCK_M=block_m, BLOCK_N=block_n,
        UNROLL=unroll, num_warps=warps)
    return out
