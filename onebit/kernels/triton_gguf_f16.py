"""Mode "f16" of the packed GGUF products: Q4_K and Q5_K at 8-64 activation rows on float16 tensor
cores with the sub-block scales inside the weights (mode "f16s": d too, each weight rounded once to
float16; it takes Q6_K as well, below).

Mode "int" (`triton_gguf_repacked`) multiplies each 32-column sub-block on its own and rescales the
[weight rows, activation rows] float32 accumulator per sub-block (s * D - o * sum(x)): at 64 rows that
is about six accumulator operations a weight, and three live accumulators hold it to two blocks an SM.
Here the 6-bit sub-block scale goes into the weight instead, where it stays exact: code * scale is an
integer of at most 15 * 63 = 945 (Q5_K: 31 * 63 = 1,953), which float16 holds exactly (11 significant
bits). So a whole 256-column group is one chain of tensor-core dots on exact integer weights, and
the accumulator sees two operations a group:

    part = sum over planes j of (scale_j * code_j) @ x16_j          (float32 accumulation)
    acc += d * part - 32 dmin * (mins @ xmean16)                    (mins @ xmean16: one K = 16 dot)

x enters as float16, scaled per row by a power of two 2**-e so that no value exceeds 2**15
(`prepare_x`: e = 0 unless a row holds a value of 2**15 or more; bf16 values in float16's normal
range convert exactly); `xmean16` is each sub-block's mean of the scaled x, in float16. The output is
multiplied by 2**e again. Reference: `gguf_repack.repacked_f16_linear_ref`; the error against the
exact product comes from rounding x and the sub-block means to float16 (tests/test_gguf_f16.py).

Q6_K (mode "f16s" only): its signed 8-bit scale times its 6-bit code (code - 32) reaches 4,064, past
float16's exact integers, so its weights go in as f16s's do, float16(float16(d * scale) * (code - 32))
(HSUB2 of 1,056 = 1,024 + 32, then HMUL2), and with no minimums a 128-column group is one chain of
eight K = 16 dots. Reference: `gguf_repack.repacked_f16s_q6_k_linear_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.gguf_repack import F16Rows
from onebit.kernels.triton_fused import _add_rms_norm_row, _norm_weight_then_wait
from onebit.kernels.triton_gguf import _store_partial
from onebit.kernels.triton_gguf_repacked import (_group_code_pairs, _load_scales, _pairs_to_dtype, _plane_byte,
                                                 _plane_code_bits, _plane_scale, _program_tile)

PREPARE_BLOCK = 256  # columns a program of `prepare_x` converts (one Q4_K group; every K here is a multiple)


@triton.jit
def _row_exponent(top):
    """e for a row whose largest magnitude is `top` (float32): the least e >= 0 with top * 2**-e < 2**15."""
    exponent = ((top.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2(top)) for normal top
    return tl.maximum(exponent - 14, 0)


@triton.jit
def _store_f16_chunk(values, e, x16_row, xm_row, k0, cols, n_valid, BLOCK: tl.constexpr, SUB: tl.constexpr):
    """Columns k0 + cols of a row (values float32 [BLOCK], the first n_valid real) as mode "f16" reads
    them: float16(values * 2**-e) into x16_row, and each SUB-column sub-block's mean of those into xm_row."""
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)
    h = (values * down).to(tl.float16)
    tl.store(x16_row + k0 + cols, h, mask=cols < n_valid)
    means = tl.sum(tl.reshape(h.to(tl.float32), (BLOCK // SUB, SUB)), axis=1) * (1.0 / SUB)
    subs = tl.arange(0, BLOCK // SUB)
    tl.store(xm_row + k0 // SUB + subs, means.to(tl.float16), mask=subs * SUB < n_valid)


@triton.jit
def _prepare_x_kernel(x_ptr, x16_ptr, xm_ptr, xe_ptr, stride_xm,
                      BLOCK: tl.constexpr, SUB: tl.constexpr, CHUNKS: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # Program (row, chunk): the whole row's largest magnitude (every chunk of a row reads the row, so
    # that one launch does it all: a few L2 reads of a <= 24 KB row), then its own BLOCK columns
    # scaled by 2**-e into float16 and each SUB-column sub-block's mean of those float16 values.
    # The row's CHUNKS reads (K = CHUNKS * BLOCK columns) are unrolled, so that they go out together: as
    # a runtime loop each waited for the one before (ncu, session 20: 4.2-4.9 us a launch at K = 4096).
    K: tl.constexpr = CHUNKS * BLOCK
    row = tl.program_id(0)
    k0 = tl.program_id(1) * BLOCK
    cols = tl.arange(0, BLOCK)
    src = x_ptr + row.to(tl.int64) * stride_xm
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for c in tl.static_range(CHUNKS):
        amax = tl.maximum(amax, tl.abs(tl.load(src + c * BLOCK + cols).to(tl.float32)))
    e = _row_exponent(tl.max(amax, axis=0))
    if k0 == 0:
        tl.store(xe_ptr + row, ((127 + e) << 23).to(tl.float32, bitcast=True))
    _store_f16_chunk(tl.load(src + k0 + cols).to(tl.float32), e, x16_ptr + row.to(tl.int64) * K,
                     xm_ptr + row.to(tl.int64) * (K // SUB), k0, cols, BLOCK, BLOCK, SUB)


def prepare_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 256) -> (x16 float16 [M, K] = x * 2**-e, xmean16 float16 [M, K / 32]
    the means of x16's 32-column sub-blocks, scale float32 [M] = 2**e), e per row the least that keeps
    every |x16| below 2**15. Reference: `gguf_repack.prepare_x_f16_ref`."""
    m, k = x.shape
    if k % PREPARE_BLOCK:
        raise ValueError(f"prepare_x takes a multiple of {PREPARE_BLOCK} columns, got {k}")
    x16 = torch.empty(m, k, dtype=torch.float16, device=x.device)
    xm = torch.empty(m, k // 32, dtype=torch.float16, device=x.device)
    xe = torch.empty(m, dtype=torch.float32, device=x.device)
    _prepare_x_kernel[(m, k // PREPARE_BLOCK)](x, x16, xm, xe, x.stride(0), BLOCK=PREPARE_BLOCK, SUB=32,
                                               CHUNKS=k // PREPARE_BLOCK, num_warps=4, **pdl.options())
    return x16, xm, xe


@triton.jit
def _add_rms_norm_f16_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x16_ptr, xm_ptr, xe_ptr, n_cols, eps,
                             HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
                             SUB: tl.constexpr, PDL: tl.constexpr = False, EARLY: tl.constexpr = False):
    # One row: add + RMSNorm as `triton_fused.add_rms_norm` stores it, then that stored row prepared as
    # `_prepare_x_kernel` prepares it, chunk by chunk through the same helper (the row read back from
    # the cache after a barrier), so the float16 values and means are the launch's own.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    w = _norm_weight_then_wait(w_ptr, cols, ok, PDL, EARLY)
    out = _add_rms_norm_row(x_ptr, res_ptr, w, res_out_ptr, row, cols, ok, n_cols, eps, HAS_RESIDUAL)
    out_row = out_ptr + row * n_cols
    tl.store(out_row + cols, out, mask=ok)
    e = _row_exponent(tl.max(tl.where(ok, tl.abs(out.to(tl.float32)), 0.0), axis=0))
    tl.store(xe_ptr + row, ((127 + e) << 23).to(tl.float32, bitcast=True))
    tl.debug_barrier()  # every thread's part of the row stored before any thread reads a chunk back
    chunk = tl.arange(0, CHUNK)
    # unrolled over BLOCK (chunks past n_cols masked off), so that the chunks' reads go out together
    for k0 in tl.static_range(0, BLOCK, CHUNK):
        _store_f16_chunk(tl.load(out_row + k0 + chunk, mask=k0 + chunk < n_cols, other=0.0).to(tl.float32), e,
                         x16_ptr + row * n_cols, xm_ptr + row * (n_cols // SUB), k0, chunk, n_cols - k0, CHUNK, SUB)


def add_rms_norm_f16(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[F16Rows, torch.Tensor | None]:
    """(rms_norm(x + residual) with mode "f16"'s preparation of it, x + residual or None) in one launch,
    for a contiguous [T, D] x with D a multiple of PREPARE_BLOCK: `F16Rows` whose x is what
    `triton_fused.add_rms_norm` returns and whose x16, xm, xe are what `prepare_x` makes of it."""
    rows, cols = x.shape
    if cols % PREPARE_BLOCK:
        raise ValueError(f"add_rms_norm_f16 takes a multiple of {PREPARE_BLOCK} columns, got {cols}")
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else out
    x16 = torch.empty(rows, cols, dtype=torch.float16, device=x.device)
    xm = torch.empty(rows, cols // 32, dtype=torch.float16, device=x.device)
    xe = torch.empty(rows, dtype=torch.float32, device=x.device)
    # 4 warps, as `add_rms_norm` and `prepare_x` launch: the same layouts, so the same order of the sums
    # (of squares, of each sub-block) and the same numbers, bit for bit
    _add_rms_norm_f16_kernel[(rows,)](x, residual if residual is not None else x, weight, out, res_out, x16, xm, xe,
                                      cols, eps, HAS_RESIDUAL=residual is not None,
                                      BLOCK=triton.next_power_of_2(cols), CHUNK=PREPARE_BLOCK, SUB=32, num_warps=4,
                                      EARLY=pdl.early_weights(), **pdl.options())
    return F16Rows(out, x16, xm, xe), (res_out if residual is not None else None)


@triton.jit
def _pack_halves(lo, hi):
    """Two float16 tensors -> int32 words holding lo in the low half, hi in the high half."""
    return (lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | (hi.to(tl.int16, bitcast=True).to(tl.int32) << 16)


@triton.jit
def _f16_pair(value):
    """float32 [BN, 1] -> int32 [BN, 1] holding float16(value) in both halves."""
    half = value.to(tl.float16)
    return _pack_halves(half, half)


@triton.jit
def _half(word, HIGH: tl.constexpr):
    """The float16 in the low (HIGH: high) half of int32 `word`, as float32."""
    if HIGH:
        word = word >> 16
    return (word & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scaled_codes(bits, scale, SCALED: tl.constexpr, ASM: tl.constexpr, SIGNED: tl.constexpr = False):
    """int32 words holding two float16s 1024 + code -> two float16s code * scale (scale float32 [BN, 1]).
    Exact scales (SCALED false, 0..63): fma(f, s, -1024 s) (one HFMA2 a pair; 1024 s <= 64,512 fits).
    SCALED (s = d * scale, any size): (f - 1024) * s (HADD2 then HMUL2), so a large s cannot overflow
    -1024 s; SIGNED (Q6_K: SCALED only) takes (f - 1056) * s = (code - 32) * s. Both round once.
    Triton's interpreter runs no PTX: with ASM false the same arithmetic in float32, rounded to
    float16, the same value since code * s is exact in float32."""
    s = _f16_pair(scale)
    if ASM:
        if SCALED:
            zero = 0x64206420 if SIGNED else 0x64006400  # float16 1056 (1024 + 32) or 1024 in both halves
            return tl.inline_asm_elementwise("sub.f16x2 $0, $1, $2;\n\tmul.f16x2 $0, $0, $3;", "=r,r,r,r",
                                             [bits, bits * 0 + zero, s], dtype=tl.int32, is_pure=True, pack=1)
        return tl.inline_asm_elementwise("fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r",
                                         [bits, s, _f16_pair(-1024.0 * scale)], dtype=tl.int32, is_pure=True, pack=1)
    h = scale.to(tl.float16).to(tl.float32)
    zero_f = 1056.0 if SIGNED else 1024.0
    return _pack_halves(((_half(bits, False) - zero_f) * h).to(tl.float16),
                        ((_half(bits, True) - zero_f) * h).to(tl.float16))


@triton.jit
def _mins(w2, w3, factor):
    """factor ([BN, 1] or a number) times the group's eight 6-bit sub-block minimums, [BN, 16] float16 (columns 8-15
    zero: the tensor cores' K is at least 16)."""
    col = tl.arange(0, 16)[None, :]
    word = tl.where(col < 4, w2, w3)
    byte = (word >> (8 * (col % 4))) & 0xFF
    return (factor * tl.where(col < 8, byte, 0).to(tl.float32)).to(tl.float16)


@triton.jit(do_not_specialize=["M", "GROUPS_PER_SPLIT", "stride_ysplit"])
def _f16_kernel(x_ptr, xm_ptr, xe_ptr, c_ptr, h_ptr, s_ptr, d_ptr, y_ptr, M, N, K, GROUPS_PER_SPLIT,
                stride_cn, stride_hn, stride_sn, stride_dn, stride_ym, stride_ysplit,
                QTYPE: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, PLANES: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, REDUCE: tl.constexpr, NUM_STAGES: tl.constexpr,
                SCALED: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # acc [BLOCK_N weight rows, BLOCK_M activation rows]; grid and REDUCE as `_repacked_kernel`'s.
    # SCALED False: weights code * scale (exact), one rescale of acc a group. SCALED True: weights
    # float16(d * scale) * code rounded once, minimums float16(-32 dmin * min): one accumulator chain.
    # Q6_K (QTYPE 3, SCALED only): weights float16(d * scale) * (code - 32), signed scales, no minimums.
    pid_k, rn, rn64, rm, m_ok, n_ok = _program_tile(M, N, BLOCK_M, BLOCK_N)
    lane = tl.arange(0, LANES)
    sub = tl.arange(0, 16)
    one = tl.arange(0, 1)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    x_lanes = x_ptr + rm[None, :].to(tl.int64) * K + lane[:, None]  # [LANES, BM]: a sub-block's x16, transposed
    x_ok = m_ok[None, :] & (lane[:, None] < LANES)
    xm_rows = xm_ptr + rm[None, :].to(tl.int64) * (K // LANES) + sub[:, None]  # [16, BM]: a group's means
    xm_ok = m_ok[None, :] & (sub[:, None] < PLANES)
    first = pid_k * GROUPS_PER_SPLIT
    for g in tl.range(first, first + GROUPS_PER_SPLIT, 1, num_stages=NUM_STAGES):
        lo_pair, hi_pair, high_pair = _group_code_pairs(c_ptr, h_ptr, rn64, n_ok, stride_cn, stride_hn, g,
                                                        BLOCK_N, LANES, QTYPE)
        w0, w1, w2, w3, d, dmin = _load_scales(s_ptr, d_ptr, rn64, n_ok, stride_sn, stride_dn, g + one, QTYPE)
        if SCALED:
            part = acc
        else:
            part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for j in tl.static_range(PLANES):
            if SCALED:
                scale = _plane_scale(w0, w1, w2, w3, d, dmin, j, QTYPE)[0]  # [BN, 1] d * scale (Q6_K's signed)
            else:
                scale = _plane_byte(w0, w1, j).to(tl.float32)  # the exact scale, 0..63
            bits = _scaled_codes(_plane_code_bits(lo_pair, hi_pair, high_pair, j, QTYPE, True), scale, SCALED, ASM,
                                 QTYPE == 3)
            w = _pairs_to_dtype(bits, BLOCK_N, LANES, tl.float16, True)
            xt = tl.load(x_lanes + (g * GROUP + j * LANES), mask=x_ok, other=0.0)
            part = tl.dot(w, xt, part)
        if QTYPE == 3:
            acc = part
        elif SCALED:
            xm = tl.load(xm_rows + g * PLANES, mask=xm_ok, other=0.0)
            acc = tl.dot(_mins(w2, w3, -32.0 * dmin), xm, part)
        else:
            xm = tl.load(xm_rows + g * PLANES, mask=xm_ok, other=0.0)
            low = tl.dot(_mins(w2, w3, 1.0), xm)  # sum over sub-blocks of min * mean(x)
            acc = tl.fma(-32.0 * dmin, low, tl.fma(d, part, acc))
    acc = acc * tl.load(xe_ptr + rm, mask=m_ok, other=1.0)[None, :]
    ok = m_ok[None, :] & n_ok[:, None]
    _store_partial(y_ptr, y_ptr + rm[None, :] * stride_ym + rn[:, None], acc, ok, pid_k, stride_ysplit, REDUCE)


def launch(x: torch.Tensor, codes, high, scales, d, target: torch.Tensor, n: int, groups_per_split: int,
           stride_t: int, stride_split: int, grid: tuple[int, int], block_n: int, reduce: int, stages: int,
           warps: int, scaled: bool, meta: dict, prepared: F16Rows | None = None) -> None:
    """Mode "f16" of `triton_gguf_repacked.matmul_few_rows` (which checks the arguments and sums the
    split-K partials): `prepare_x` (unless its producer `prepared` x already), then the product into
    `target`."""
    x16, xm, xe = prepare_x(x) if prepared is None else prepared[1:]
    m, k = x.shape
    _f16_kernel[grid](x16, xm, xe, codes, high, scales, d, target, m, n, k, groups_per_split, codes.stride(0),
                      high.stride(0), scales.stride(0), d.stride(0), stride_t, stride_split,
                      BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, REDUCE=reduce,
                      NUM_STAGES=stages, SCALED=scaled, ASM=x.device.type == "cuda", num_warps=warps, **meta,
                      **pdl.options())
