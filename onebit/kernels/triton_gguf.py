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
A second few-row design, `matmul_few_rows` (split-K, pipelined word loads, a CUDA-core "gemv" or a
`tl.dot` variant; see the comment above `FewRowsConfig`), waits for its device sweep: `matmul` uses it
only when FEW_ROWS_DEFAULT or its config says so.
Reference: `onebit.kernels.gguf_quants.packed_linear_ref`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from onebit.kernels.triton_split_k import reduce_partials

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
def _k_quant_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, step, QTYPE: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """Super-block `step` of rows rn for a K-quant (QTYPE 1 Q4_K, 2 Q5_K, 3 Q6_K): its two weight tiles
    and their columns, (w_a, col_a, w_b, col_b)."""
    if QTYPE == 3:
        return _q6_k_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, step, BLOCK_N)
    return _k4_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, step, QTYPE == 2, BLOCK_N)


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
        w_a, col_a, w_b, col_b = _k_quant_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn,
                                               step, QTYPE, BLOCK_N)
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
        w_a, col_a, w_b, col_b = _k_quant_step(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn,
                                               step, QTYPE, BLOCK_N)
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


def matmul(x: torch.Tensor, weight, out: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """x [M, K] @ weight.T into out [M, rows] (a fresh tensor when None; a column slice of a wider
    output is fine: unit column stride). Above MAX_KERNEL_ROWS rows: dequantize, then cuBLAS. Up to
    MAX_KERNEL_ROWS: `matmul_few_rows` when config is a FewRowsConfig, or when config is None and
    FEW_ROWS_DEFAULT is set; else the tile kernel with config (BLOCK_N, UNROLL, warps) or its default."""
    m, k = x.shape
    if m <= MAX_KERNEL_ROWS and (isinstance(config, FewRowsConfig) or (config is None and FEW_ROWS_DEFAULT)):
        few = config or (FEW_ROWS_DEFAULT(m) if callable(FEW_ROWS_DEFAULT) else FEW_ROWS_DEFAULT)
        return matmul_few_rows(x, weight, out, few)
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


# ---------------------------------------------------------------------------------------------
# Few-row products, second design (M = 1..16): wide loads, every load pipelined, split-K.
#
# Why the tile kernel above reads only 0.40 TB/s (reasoned from the code, not profiled): its sub-block
# scales and super-scales are 1- and 2-byte gathers, which Triton cannot turn into asynchronous copies
# (cp.async moves 4, 8 or 16 bytes), so its loop is not software-pipelined and every step waits one
# full DRAM round trip; UNROLL does not help, because the layout conversions that feed `tl.dot` put
# barriers between the unrolled steps; and a program walks all of K (16 steps at K = 4096) with only
# 192-384 programs for 132 SMs, so there are few bytes in flight per SM. The kernel below:
# - loads every scale as whole 32-bit words (the int32 views of the scale and super-scale arrays)
#   and decodes them in registers, so all its loads can be pipelined (`tl.range(num_stages=...)`,
#   which Triton also needs to pipeline a loop without `tl.dot` at all);
# - takes SB super-blocks per loop turn as one contiguous run of quant bytes per row;
# - splits K over SPLIT programs per row tile (grid axis 1) to have many programs in flight; their
#   partial sums meet either in a float32 workspace summed in a fixed order by a second small kernel
#   (reduce="sum": deterministic) or by atomic adds into the zeroed output (reduce="atomic": one
#   kernel less, but the order of the additions, so the last bits, vary from run to run);
# - multiplies either with `tl.dot` (kernel="dot": the dequantized tile goes through shared memory
#   in the dot-operand layout) or with a broadcast product summed over K in float32 on the CUDA
#   cores (kernel="gemv": no layout conversion; scales applied once per sub-block to the sub-block's
#   partial sum, the min once per sub-block through the activations' sub-block sums). The FMA count
#   of "gemv" grows with the rows, so it is meant for 1-4 (maybe 8) rows.
# Nothing here has been timed yet: bench/gpu_gguf_quant.py sweeps FEW_ROWS_CONFIGS against the tile
# kernel and bf16 cuBLAS. Until it has, `matmul` uses this kernel only when FEW_ROWS_DEFAULT (or the
# `few_rows` argument) says so.


class FewRowsConfig(NamedTuple):
    """A launch of `matmul_few_rows`: kernel "gemv" or "dot"; BLOCK_N weight rows per program; SB steps
    (super-blocks; Q8_0: 128 values) per loop turn; split: programs along K (0: enough for ~1024
    programs); reduce "sum" (deterministic) or "atomic"; warps; pipeline stages. SB and split are
    powers of two, halved at launch until they divide the steps."""

    kernel: str = "gemv"
    block_n: int = 8
    sb: int = 2
    split: int = 0
    reduce: str = "sum"
    warps: int = 4
    stages: int = 3


# Candidates the device script sweeps (named so its table can say which won).
FEW_ROWS_CONFIGS = {
    "gemv8-sb2-auto": FewRowsConfig("gemv", 8, 2, 0, "sum", 4, 3),
    "gemv16-sb1-auto": FewRowsConfig("gemv", 16, 1, 0, "sum", 4, 3),
    "gemv4-sb2-auto": FewRowsConfig("gemv", 4, 2, 0, "sum", 2, 3),
    "gemv8-sb2-split1": FewRowsConfig("gemv", 8, 2, 1, "sum", 4, 3),
    "gemv8-sb2-atomic": FewRowsConfig("gemv", 8, 2, 0, "atomic", 4, 3),
    "dot16-sb1-auto": FewRowsConfig("dot", 16, 1, 0, "sum", 4, 3),
    "dot16-sb2-auto": FewRowsConfig("dot", 16, 2, 0, "sum", 4, 3),
    "dot32-sb1-auto": FewRowsConfig("dot", 32, 1, 0, "sum", 4, 3),
    "dot16-sb1-split1": FewRowsConfig("dot", 16, 1, 1, "sum", 4, 3),
    "dot16-sb1-atomic": FewRowsConfig("dot", 16, 1, 0, "atomic", 4, 3),
}
# None: `matmul` keeps the tile kernel for 1-16 rows. Set to a FewRowsConfig (or a function rows ->
# FewRowsConfig) once the device sweep has picked one.
FEW_ROWS_DEFAULT = None
TARGET_PROGRAMS = 1024  # split="auto" raises SPLIT until the grid has about this many programs


@triton.jit
def _f16_bits_to_float(bits):
    """The f16 whose bits are the low 16 of int32 `bits`, as float32."""
    return (bits & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _byte(words, index):
    """Byte `index` (0-3, little-endian) of int32 `words`, as int32 0..255."""
    return (words >> (8 * index)) & 255


@triton.jit
def _fr_k4(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, s0,
           FIFTH_BIT: tl.constexpr, SB: tl.constexpr):
    """Q4_K/Q5_K, super-blocks s0 .. s0 + SB of rows rn, as chunks ch of 32 quant bytes (block
    s0 + ch // 4, quarter c = ch % 4): int quants of the low and high nibbles [BN, C, 32], per chunk
    their scale and min [BN, C] (sub-blocks 2c and 2c + 1), and their columns [C, 32].
    s_ptr/d_ptr are int32 views: 3 words of packed scales, 1 word (d, dmin) per block."""
    C: tl.constexpr = SB * 4
    ch = tl.arange(0, C)
    lane = tl.arange(0, 32)
    blk = s0 + ch // 4
    c = ch % 4
    rows = rn[:, None, None].to(tl.int64)
    mask3 = n_ok[:, None, None]
    if FIFTH_BIT:  # per block: 32 bytes of fifth bits, then the 128 nibble bytes
        base = q_ptr + rows * stride_qn + (blk * 160)[None, :, None]
        qs = tl.load(base + 32 + (c * 32)[None, :, None] + lane[None, None, :], mask=mask3, other=0)
        qh = tl.load(base + lane[None, None, :], mask=mask3, other=0).to(tl.int32)
    else:  # one contiguous run of SB * 128 bytes per row
        qs = tl.load(q_ptr + rows * stride_qn + s0 * 128 + ch[None, :, None] * 32 + lane[None, None, :],
                     mask=mask3, other=0)
    lo = (qs & 15).to(tl.int32)
    hi = (qs >> 4).to(tl.int32)
    if FIFTH_BIT:
        lo = lo | (((qh >> (2 * c)[None, :, None]) & 1) << 4)
        hi = hi | (((qh >> (2 * c + 1)[None, :, None]) & 1) << 4)
    mask2 = n_ok[:, None]
    srow = s_ptr + rn[:, None].to(tl.int64) * stride_sn + (blk * 3)[None, :]
    w0 = tl.load(srow, mask=mask2, other=0)  # scale bytes 0-3: 6-bit scales of sub-blocks 0-3 (+2 high bits)
    w1 = tl.load(srow + 1, mask=mask2, other=0)  # bytes 4-7: mins of 0-3 (+2 high bits)
    w2 = tl.load(srow + 2, mask=mask2, other=0)  # bytes 8-11: low 4 bits of scales/mins of 4-7
    first = (c < 2)[None, :]  # sub-blocks 2c, 2c + 1 < 4
    i_lo = ((2 * c) % 4)[None, :]
    i_hi = ((2 * c + 1) % 4)[None, :]
    a, b, e = _byte(w0, i_lo), _byte(w1, i_lo), _byte(w2, i_lo)
    sc_lo = tl.where(first, a & 63, (e & 15) | ((a >> 6) << 4)).to(tl.float32)
    mn_lo = tl.where(first, b & 63, (e >> 4) | ((b >> 6) << 4)).to(tl.float32)
    a, b, e = _byte(w0, i_hi), _byte(w1, i_hi), _byte(w2, i_hi)
    sc_hi = tl.where(first, a & 63, (e & 15) | ((a >> 6) << 4)).to(tl.float32)
    mn_hi = tl.where(first, b & 63, (e >> 4) | ((b >> 6) << 4)).to(tl.float32)
    dw = tl.load(d_ptr + rn[:, None].to(tl.int64) * stride_dn + blk[None, :], mask=mask2, other=0)
    d = _f16_bits_to_float(dw)
    dmin = _f16_bits_to_float(dw >> 16)
    col = (s0 * 256 + ch * 64)[:, None] + lane[None, :]
    return lo, d * sc_lo, dmin * mn_lo, col, hi, d * sc_hi, dmin * mn_hi, col + 32


@triton.jit
def _fr_q6_k(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, s0,
             SB: tl.constexpr, D_WORDS: tl.constexpr):
    """Q6_K, super-blocks s0 .. s0 + SB of rows rn, as chunks ch of 16 low-nibble bytes (block
    s0 + ch // 8, G = ch % 8 = 4h + g): the quants (+32) built on low and on high nibbles [BN, C, 16],
    their scales [BN, C] (sub-blocks 8h + g and 8h + g + 4) and columns [C, 16]. s_ptr: int32 view
    (4 words of int8 scales per block); d_ptr: an int32 view of the f16 d's when D_WORDS (an even
    number of blocks per row), else the f16 d's."""
    C: tl.constexpr = SB * 8
    ch = tl.arange(0, C)
    lane = tl.arange(0, 16)
    blk = s0 + ch // 8
    grp = ch % 8
    h, g = grp // 4, grp % 4
    rows = rn[:, None, None].to(tl.int64)
    mask3 = n_ok[:, None, None]
    base = q_ptr + rows * stride_qn + (blk * 192)[None, :, None]
    ql = tl.load(base + (grp * 16)[None, :, None] + lane[None, None, :], mask=mask3, other=0).to(tl.int32)
    qh = tl.load(base + (128 + h * 32 + (g % 2) * 16)[None, :, None] + lane[None, None, :],
                 mask=mask3, other=0).to(tl.int32)
    shift = (2 * (g // 2))[None, :, None]
    q_lo = (ql & 15) | (((qh >> shift) & 3) << 4)
    q_hi = (ql >> 4) | (((qh >> (shift + 4)) & 3) << 4)
    mask2 = n_ok[:, None]
    srow = s_ptr + rn[:, None].to(tl.int64) * stride_sn + (blk * 4 + 2 * h)[None, :]
    sc_lo = ((_byte(tl.load(srow, mask=mask2, other=0), g[None, :]) ^ 128) - 128).to(tl.float32)
    sc_hi = ((_byte(tl.load(srow + 1, mask=mask2, other=0), g[None, :]) ^ 128) - 128).to(tl.float32)
    drow = d_ptr + rn[:, None].to(tl.int64) * stride_dn
    if D_WORDS:
        d = _f16_bits_to_float(tl.load(drow + (blk // 2)[None, :], mask=mask2, other=0) >> (16 * (blk % 2))[None, :])
    else:
        d = tl.load(drow + blk[None, :], mask=mask2, other=0.0).to(tl.float32)
    col = (blk * 256 + h * 128 + g * 16)[:, None] + lane[None, :]
    return q_lo, d * sc_lo, col, q_hi, d * sc_hi, col + 64


@triton.jit
def _fr_q8_0(q_ptr, d_ptr, rn, n_ok, stride_qn, stride_dn, s0, SB: tl.constexpr):
    """Q8_0, values s0 * 128 .. (s0 + SB) * 128 of rows rn as blocks of 32: the quants + 128 [BN, C, 32]
    (one contiguous run per row), their scales [BN, C] (d_ptr: an int32 view of the f16 d's), columns."""
    C: tl.constexpr = SB * 4
    ch = tl.arange(0, C)
    lane = tl.arange(0, 32)
    blk = s0 * 4 + ch
    q = tl.load(q_ptr + rn[:, None, None].to(tl.int64) * stride_qn + s0 * 128 + ch[None, :, None] * 32
                + lane[None, None, :], mask=n_ok[:, None, None], other=0).to(tl.int32) + 128
    dw = tl.load(d_ptr + rn[:, None].to(tl.int64) * stride_dn + (blk // 2)[None, :], mask=n_ok[:, None], other=0)
    d = _f16_bits_to_float(dw >> (16 * (blk % 2))[None, :])
    return q, d, (s0 * 128 + ch * 32)[:, None] + lane[None, :]


@triton.jit
def _fr_accumulate(acc, x_ptr, rm, m_ok, stride_xm, q, scale, minimum, col, BIAS: tl.constexpr,
                   HAS_MIN: tl.constexpr, USE_DOT: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc [BM, BN] + x[:, col] @ (scale * (q - BIAS) - minimum).T for chunks of int quants q [BN, C, L]
    with per-chunk scale and minimum [BN, C] and columns col [C, L]."""
    qf = _small_int_to_float(q, BIAS)
    if USE_DOT:
        w = qf * scale[:, :, None]
        if HAS_MIN:
            w = w - minimum[:, :, None]
        C: tl.constexpr = q.shape[1]
        L: tl.constexpr = q.shape[2]
        x = tl.load(x_ptr + rm[:, None] * stride_xm + tl.reshape(col, (C * L,))[None, :], mask=m_ok[:, None],
                    other=0.0)
        acc = tl.dot(x, tl.trans(tl.reshape(w, (BLOCK_N, C * L)).to(x.dtype)), acc)
    else:
        x = tl.load(x_ptr + rm[:, None, None] * stride_xm + col[None, :, :], mask=m_ok[:, None, None],
                    other=0.0).to(tl.float32)  # [BM, C, L]
        chunk_sums = tl.sum(qf[None, :, :, :] * x[:, None, :, :], axis=3)  # [BM, BN, C]
        acc += tl.sum(chunk_sums * scale[None, :, :], axis=2)
        if HAS_MIN:
            acc -= tl.sum(tl.sum(x, axis=2)[:, None, :] * minimum[None, :, :], axis=2)
    return acc


@triton.jit
def _few_rows_kernel(x_ptr, q_ptr, s_ptr, d_ptr, y_ptr, M, N, STEPS_PER_SPLIT, stride_xm, stride_qn, stride_sn,
                     stride_dn, stride_ym, stride_ysplit, QTYPE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, SB: tl.constexpr, USE_DOT: tl.constexpr, REDUCE: tl.constexpr,
                     D_WORDS: tl.constexpr, NUM_STAGES: tl.constexpr):
    # Program (pid_n, pid_k): rows pid_n * BLOCK_N.., steps pid_k * STEPS_PER_SPLIT.. (a multiple of SB).
    # REDUCE 0: store into y; 1: store the float32 partial into y + pid_k * stride_ysplit; 2: atomic add.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = pid_k * STEPS_PER_SPLIT
    for s0 in tl.range(first, first + STEPS_PER_SPLIT, SB, num_stages=NUM_STAGES):
        if QTYPE == 0:
            q, scale, col = _fr_q8_0(q_ptr, d_ptr, rn, n_ok, stride_qn, stride_dn, s0, SB)
            acc = _fr_accumulate(acc, x_ptr, rm, m_ok, stride_xm, q, scale, scale, col, 128, False, USE_DOT,
                                 BLOCK_N)
        elif QTYPE == 3:
            q_a, sc_a, col_a, q_b, sc_b, col_b = _fr_q6_k(q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn,
                                                          stride_dn, s0, SB, D_WORDS)
            acc = _fr_accumulate(acc, x_ptr, rm, m_ok, stride_xm, q_a, sc_a, sc_a, col_a, 32, False, USE_DOT,
                                 BLOCK_N)
            acc = _fr_accumulate(acc, x_ptr, rm, m_ok, stride_xm, q_b, sc_b, sc_b, col_b, 32, False, USE_DOT,
                                 BLOCK_N)
        else:
            q_a, sc_a, mn_a, col_a, q_b, sc_b, mn_b, col_b = _fr_k4(
                q_ptr, s_ptr, d_ptr, rn, n_ok, stride_qn, stride_sn, stride_dn, s0, QTYPE == 2, SB)
            acc = _fr_accumulate(acc, x_ptr, rm, m_ok, stride_xm, q_a, sc_a, mn_a, col_a, 0, True, USE_DOT,
                                 BLOCK_N)
            acc = _fr_accumulate(acc, x_ptr, rm, m_ok, stride_xm, q_b, sc_b, mn_b, col_b, 0, True, USE_DOT,
                                 BLOCK_N)
    ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    _store_partial(y_ptr, ptrs, acc, ok, pid_k, stride_ysplit, REDUCE)


@triton.jit
def _store_partial(y_ptr, ptrs, acc, ok, pid_k, stride_ysplit, REDUCE: tl.constexpr):
    # A few-row program's float32 result: stored (REDUCE 0), stored as split pid_k's partial for
    # `triton_split_k.reduce_partials` (1), or added atomically (2).
    if REDUCE == 0:
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=ok)
    elif REDUCE == 1:
        tl.store(ptrs + pid_k * stride_ysplit, acc, mask=ok)
    else:
        tl.atomic_add(ptrs, acc.to(y_ptr.dtype.element_ty), mask=ok, sem="relaxed")


def _word_view(t: torch.Tensor) -> torch.Tensor:
    """t (rows of bytes or halves, unit column stride) seen as int32 words."""
    return t.view(torch.int32)


def _auto_split(row_tiles: int, groups: int) -> int:
    """Programs along K: doubled while the grid is under TARGET_PROGRAMS and the groups split evenly."""
    split = 1
    while row_tiles * split < TARGET_PROGRAMS and groups % (split * 2) == 0:
        split *= 2
    return split


def matmul_few_rows(x: torch.Tensor, weight, out: torch.Tensor | None = None,
                    config: FewRowsConfig | None = None) -> torch.Tensor:
    """x [M <= 16, K] @ weight.T into out [M, rows] (fresh when None; a column slice is fine), with the
    second few-row design (see the comment above FewRowsConfig). Reference:
    `onebit.kernels.gguf_quants.packed_linear_ref`."""
    config = config or FewRowsConfig()
    m, k = x.shape
    if k != weight.cols:
        raise ValueError(f"x has {k} columns, the weight {weight.cols}")
    if m > MAX_KERNEL_ROWS:
        raise ValueError(f"matmul_few_rows takes at most {MAX_KERNEL_ROWS} rows, got {m}")
    if config.kernel not in ("gemv", "dot") or config.reduce not in ("sum", "atomic"):
        raise ValueError(f"unknown few-row config {config}")
    if out is None:
        out = torch.empty(m, weight.rows, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    quants, scales, d = _operands(weight)
    qtype = QTYPE_IDS[weight.qtype]
    d_words = qtype != 3 or d.shape[1] % 2 == 0
    if qtype != 0:
        scales = _word_view(scales)
    if d_words:
        d = _word_view(d)
    steps = weight.cols // STEP[weight.qtype]
    sb = config.sb
    while steps % sb:
        sb //= 2
    groups = steps // sb
    row_tiles = triton.cdiv(weight.rows, config.block_n)
    split = config.split or _auto_split(row_tiles, groups)
    while groups % split:  # as SB: the largest power of two at most the asked one that divides
        split //= 2
    use_dot = config.kernel == "dot"
    block_m = 16 if use_dot else triton.next_power_of_2(m)
    reduce = 0 if split == 1 else 1 if config.reduce == "sum" else 2
    target, stride_t, stride_split = out, out.stride(0), 0
    if reduce == 1:
        target = torch.empty(split, m, weight.rows, dtype=torch.float32, device=x.device)
        stride_t, stride_split = weight.rows, m * weight.rows
    elif reduce == 2:
        out.zero_()
    _few_rows_kernel[(row_tiles, split)](
        x, quants, scales, d, target, m, weight.rows, steps // split, x.stride(0), quants.stride(0),
        scales.stride(0), d.stride(0), stride_t, stride_split, QTYPE=qtype, BLOCK_M=block_m,
        BLOCK_N=config.block_n, SB=sb, USE_DOT=use_dot, REDUCE=reduce, D_WORDS=d_words,
        NUM_STAGES=config.stages, num_warps=config.warps)
    if reduce == 1:
        reduce_partials(target, None, None, out)
    return out
