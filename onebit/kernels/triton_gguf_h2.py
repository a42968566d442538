"""Mode "h2" of the packed GGUF products: Q4_K and Q6_K at one activation row in float16 pairs on the
CUDA cores.

At one row every weight is used once, so the product is a race against memory bandwidth, and mode
"fma" loses it on instruction issue: each weight costs a mask-and-or, a float32 FMA to scale the
code, a subtraction of the offset and the FMA into the accumulator (6.5 instructions a weight in
SASS against ~4.4 that the H200's issue rate allows at 4.24 TB/s). Here two weights share each
instruction, in float16 pairs (HFMA2), and the offset leaves the inner loop:

    word w (lane p of a group) holds planes 0-3 in its low half, planes 4-7 in its high half, so
    w & 0x000F000F is the float16 pair (q0, q4) * 2**-24 (subnormals: exact, no magic number and no
    shuffling); planes 1, 5 come in place as 16 q (mask 0x00F000F0), planes 2, 3 and 6, 7 after w >> 8;
    fma(codes, (s, s') * 2**10, 0) (planes 1, 5: * 2**6) = (s q, s' q') * 2**-14 exactly (a 6-bit scale
    times a 4-bit code is at most 945: 11 bits), one HFMA2;
    acc = fma(weights, (x, x'), acc)   with x, x' the activations at those two columns, one HFMA2.

Per group (256 columns) and weight row the two halves of acc are summed into float32 and multiplied
by d; the minimums enter once a group in float32 as dmin * sum over sub-blocks of min * sum(x).
Q6_K (groups of 128, sub-blocks of 16) merges its top two bits above the nibble, takes its signed
scale through 1152 + s, and puts its -32 offset inside the first FMA: fma(codes, s * 2**8, -32 s *
2**-16) = s (q - 32) * 2**-16, rounded to 11 significant bits past 2,048. SASS of the loop
(tools/sass_loop_count.py): 2.3-2.6 instructions a weight for Q4_K, 3.9-4.6 for Q6_K.

x enters as float16 pairs in that (plane j, plane j + 4) order, scaled by a power of two 2**-e per
split-K slice so that max |x| lands in [2**12, 2**13): the weights are at most 945 * 2**-14 < 0.06
(Q6_K 4,096 * 2**-16), so a thread's float16 sum of at most 4 x 32 pair products stays below 60,500
(float16's largest is 65,504) while ordinary products stay clear of float16's subnormals. Each program converts its own
slice (its K range of x, a few KB) into a scratch array at the start, the programs sharing a slice
writing the same values, then reads it back after a barrier: no extra launch. The error against the
exact product is x's rounding to float16 (2**-12 relative) plus the float16 sums (a float16 step of
each thread's partial sum); reference `gguf_repack.repacked_h2_linear_ref` and the bound in
tests/test_gguf_h2.py.

Layout: a program owns BLOCK_N weight rows and walks its slice a group at a time; THREADS threads
share a (row, group), each loading 4-word chunks spaced 4 * THREADS words apart, so a warp's load
covers whole 128-byte lines once THREADS is 8 and fewer rows a load below (THREADS 1: one thread
walks a row's group alone; the per-group scale work is repeated by each of the THREADS threads).
BLOCK_N above 32 * warps / THREADS gives a thread several rows, which share its loads of x.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.gguf_repack import GROUPING
from onebit.kernels.triton_gguf import _store_partial
from onebit.kernels.triton_gguf_f16 import _half, _pack_halves
from onebit.kernels.triton_gguf_repacked import QTYPE_IDS

# constexprs: the kernels read them. float16 pairs are written as the signed int32 word they are.
X_TOP_LOG2 = tl.constexpr(12)  # max |x| * 2**-e in [2**12, 2**13)
MINUS_1024_PAIR = tl.constexpr(0xE400E400 - 2**32)  # (-1024, -1024)
MINUS_1152_PAIR = tl.constexpr(0xE480E480 - 2**32)  # (-1152, -1152)
# Per type: a scale pair is multiplied by the EVEN power of two for the even plane pairs (codes read as
# q * 2**-24) and by the ODD one, 16 times smaller, for the odd pairs (read in place as 16 q * 2**-24);
# the weights then come out times 2**-W_LOG2.
Q4_K_SCALE_EVEN = tl.constexpr(0x64006400)  # 2**10: weights s q * 2**-14
Q4_K_SCALE_ODD = tl.constexpr(0x54005400)  # 2**6
Q6_K_SCALE_EVEN = tl.constexpr(0x5C005C00)  # 2**8: weights s (q - 32) * 2**-16
Q6_K_SCALE_ODD = tl.constexpr(0x4C004C00)  # 2**4
Q6_K_OFFSET_EVEN = tl.constexpr(0x80208020 - 2**32)  # -2**-19 (a subnormal): c = -32 * 2**-24 * s
Q6_K_OFFSET_ODD = tl.constexpr(0x82008200 - 2**32)  # -2**-15 (a subnormal): c = -32 * 2**-20 * s
W_LOG2 = {"Q4_K": 14, "Q6_K": 16}


def kernel_constants(qtype: str) -> dict:
    """The type's constexprs of `_h2_kernel`: its id, group values and words (`gguf_repack.GROUPING`),
    the weights' power-of-two scale to undo, and the x scratch's int32 words a group ((plane jp, plane
    jp + 4) pairs x lanes, then 8 float32 sums)."""
    group, lanes, _, _ = GROUPING[qtype]
    return dict(QTYPE=QTYPE_IDS[qtype], GROUP=group, LANES=lanes, W_SCALE=float(2 ** W_LOG2[qtype]),
                STRIDE=4 * lanes + 8)


@triton.jit
def _pack(lo, hi):
    """Two float32 tensors rounded to float16 -> int32 words with lo in the low half, hi in the high."""
    return _pack_halves(lo.to(tl.float16), hi.to(tl.float16))


@triton.jit
def _hadd2(a, b):
    """a + b on float16 pairs held in int32 words (HADD2)."""
    return tl.inline_asm_elementwise("add.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def _hadd2_emulated(a, b):
    """`_hadd2` in float32 rounded to float16 (Triton's interpreter runs no PTX)."""
    return _pack(_half(a, False) + _half(b, False), _half(a, True) + _half(b, True))


@triton.jit
def _hmul2(a, b, ASM: tl.constexpr):
    """a * b on float16 pairs (HMUL2; ASM false: emulated, the same value: a float16 product is exact in
    float32 and both round once to float16)."""
    if ASM:
        return tl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                         is_pure=True, pack=1)
    return _pack(_half(a, False) * _half(b, False), _half(a, True) * _half(b, True))


@triton.jit
def _weights_fma2(codes, s, c, x, acc, ASM: tl.constexpr):
    """acc + fma(codes, s, c) * x on float16 pairs: the scaled weights (exact up to 11 significant bits)
    times x, added (two HFMA2). ASM false: in float32, each step rounded to float16 (the second may
    round twice where HFMA2 rounds once)."""
    if ASM:
        return tl.inline_asm_elementwise("{\n\t.reg .b32 w;\n\tfma.rn.f16x2 w, $1, $2, $3;\n\t"
                                         "fma.rn.f16x2 $0, w, $4, $5;\n\t}", "=r,r,r,r,r,r", [codes, s, c, x, acc],
                                         dtype=tl.int32, is_pure=True, pack=1)
    w = _pack(_half(codes, False) * _half(s, False) + _half(c, False), _half(codes, True) * _half(s, True) + _half(c, True))
    return _pack(_half(w, False) * _half(x, False) + _half(acc, False),
                 _half(w, True) * _half(x, True) + _half(acc, True))


@triton.jit
def _pair_sum(acc, axis: tl.constexpr, ASM: tl.constexpr):
    """Sum of float16 pairs along `axis` (in float16: each thread's part stays in registers)."""
    if ASM:
        return tl.reduce(acc, axis, _hadd2)
    return tl.reduce(acc, axis, _hadd2_emulated)


@triton.jit
def _scale_pairs(lo_word, hi_word, jp: tl.constexpr, QTYPE: tl.constexpr, ASM: tl.constexpr):
    """Sub-blocks jp and jp + 4's scales (byte jp of lo_word, of hi_word; Q6_K's signed) as the float16
    pairs (s, c): Q4_K s = (sc, sc') * 2**10, c = 0; Q6_K s = (sc, sc') * 2**8, c = -32 s * 2**-24, so
    that fma(codes, s, c) is the weight (jp odd: s / 16 and c alike, for codes read in place as 16 q)."""
    if QTYPE == 3:  # signed bytes: 1024 + 128 + sc - 1152
        magic = ((((lo_word >> (8 * jp)) & 0xFF) ^ 0x80) | ((((hi_word >> (8 * jp)) & 0xFF) ^ 0x80) << 16)
                 | 0x64006400)
        minus = 0 * lo_word + MINUS_1152_PAIR
    else:  # 1024 + sc - 1024
        magic = ((lo_word >> (8 * jp)) & 0xFF) | (((hi_word >> (8 * jp)) & 0xFF) << 16) | 0x64006400
        minus = 0 * lo_word + MINUS_1024_PAIR
    if ASM:
        pair = _hadd2(magic, minus)  # (sc, sc'), exact
    else:
        pair = _hadd2_emulated(magic, minus)
    if QTYPE == 3:
        if jp % 2 == 0:
            s = _hmul2(pair, 0 * lo_word + Q6_K_SCALE_EVEN, ASM)
            return s, _hmul2(s, 0 * lo_word + Q6_K_OFFSET_EVEN, ASM)
        s = _hmul2(pair, 0 * lo_word + Q6_K_SCALE_ODD, ASM)
        return s, _hmul2(s, 0 * lo_word + Q6_K_OFFSET_ODD, ASM)
    if jp % 2 == 0:
        return _hmul2(pair, 0 * lo_word + Q4_K_SCALE_EVEN, ASM), 0 * lo_word
    return _hmul2(pair, 0 * lo_word + Q4_K_SCALE_ODD, ASM), 0 * lo_word


@triton.jit
def _plane_pair_codes(words, shifted, high2, jp: tl.constexpr, QTYPE: tl.constexpr):
    """Planes jp and jp + 4's codes as float16 subnormal pairs: (q, q') * 2**-24 for jp even (the low
    nibbles of `words`, jp 2 after >> 8 in `shifted`), (16 q, 16 q') * 2**-24 for jp odd (in place). Q6_K
    adds the top two bits from high2 (plane j's at bits 2j of each half) above the nibble."""
    if jp < 2:
        src = words
    else:
        src = shifted
    if jp % 2 == 0:
        codes = src & 0x000F000F
    else:
        codes = src & 0x00F000F0
    if QTYPE == 3:
        if jp == 0:
            codes = codes | ((high2 << 4) & 0x00300030)
        elif jp == 1:
            codes = codes | ((high2 << 6) & 0x03000300)
        elif jp == 2:
            codes = codes | (high2 & 0x00300030)
        else:
            codes = codes | ((high2 << 2) & 0x03000300)
    return codes


@triton.jit
def _slice_exponent(x_ptr, k0, SLICE: tl.constexpr, GROUP: tl.constexpr):
    """e (int32) with max |x[k0 : k0 + SLICE]| * 2**-e in [2**12, 2**13), clamped to -126..126 (a zero
    or subnormal slice: -126)."""
    cols = tl.arange(0, GROUP)
    top = tl.zeros((GROUP,), dtype=tl.float32)
    for k in tl.range(0, SLICE, GROUP):
        top = tl.maximum(top, tl.abs(tl.load(x_ptr + k0 + k + cols).to(tl.float32)))
    exponent = ((tl.max(top, axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2) if normal
    return tl.minimum(tl.maximum(exponent - X_TOP_LOG2, -126), 126)


@triton.jit
def _pow2(e):
    """2**e as float32 for an int32 e in -126..127."""
    return ((127 + e) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _write_slice_pairs(x_ptr, xp_ptr, g_first, SLICE_GROUPS: tl.constexpr, down, GROUP: tl.constexpr,
                       LANES: tl.constexpr, STRIDE: tl.constexpr, SUMS: tl.constexpr):
    """The slice's x (groups g_first..) times `down`, as float16 pairs in the product's order: per
    group words (jp, lane) = (x[LANES jp + lane], x[LANES (jp + 4) + lane]), then (SUMS) the eight
    sub-blocks' float32 sums of those float16 values, times 2**-14."""
    jp = tl.arange(0, 4)
    lane = tl.arange(0, LANES)
    offs = jp[:, None] * LANES + lane[None, :]
    for gi in tl.range(0, SLICE_GROUPS):
        g = g_first + gi
        src = x_ptr + g * GROUP + offs
        lo = (tl.load(src).to(tl.float32) * down).to(tl.float16).to(tl.float32)
        hi = (tl.load(src + 4 * LANES).to(tl.float32) * down).to(tl.float16).to(tl.float32)
        dst = xp_ptr + g * STRIDE
        tl.store(dst + offs, _pack(lo, hi))
        if SUMS:
            sums = (dst + 4 * LANES).to(tl.pointer_type(tl.float32))
            tl.store(sums + jp, tl.sum(lo, axis=1) * (1.0 / 16384.0))
            tl.store(sums + 4 + jp, tl.sum(hi, axis=1) * (1.0 / 16384.0))


@triton.jit
def _minimums(w2, w3, sums_ptr, t, THREADS: tl.constexpr):
    """Q4_K: thread column t's share of the eight sub-blocks' min * sum(x), float32 [BN, THREADS]
    (column t takes sub-blocks t * 8 / THREADS ..; a column past the eighth sub-block none)."""
    PER: tl.constexpr = (8 + THREADS - 1) // THREADS
    low = tl.zeros(t.shape, dtype=tl.float32) + 0.0 * w2.to(tl.float32)
    for i in tl.static_range(PER):
        j = t * PER + i  # [1, THREADS]
        byte = (tl.where(j < 4, w2, w3) >> (8 * (j % 4))) & 0xFF
        xs = tl.load(sums_ptr + j, mask=j < 8, other=0.0)
        low += ((byte | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * xs
    return low


@triton.jit
def _load_group(row_words, row_high, row_ok, s_rows, d_rows, n_ok, g, t, LANES: tl.constexpr, QTYPE: tl.constexpr):
    """Group g's codes [CH, BN, THREADS, 4] (Q6_K: with the top bits, high2, else the codes again), its
    scale words [BN, THREADS] (sub-blocks 0-3, 4-7; Q4_K: then the minimums') and its d: Q4_K the
    (d, dmin) float16 word [BN, 1], Q6_K the float32 d of its super-block."""
    words = tl.load(row_words + g * LANES, mask=row_ok, other=0)
    if QTYPE == 3:
        h = tl.load(row_high + g * LANES, mask=row_ok, other=0).to(tl.int32)
        high2 = (h & 0xFF) | ((h & 0xFF00) << 8)  # plane j's top bits at 2j of each half (j, j + 4)
        w0 = tl.load(s_rows + 2 * g, mask=n_ok, other=0)[:, None] + 0 * t
        w1 = tl.load(s_rows + 2 * g + 1, mask=n_ok, other=0)[:, None] + 0 * t
        dw = tl.load(d_rows + g // 2, mask=n_ok, other=0.0)[:, None]
        return words, high2, w0, w1, w0, w1, dw
    w0 = tl.load(s_rows + 4 * g, mask=n_ok, other=0)[:, None] + 0 * t
    w1 = tl.load(s_rows + 4 * g + 1, mask=n_ok, other=0)[:, None] + 0 * t
    w2 = tl.load(s_rows + 4 * g + 2, mask=n_ok, other=0)[:, None] + 0 * t
    w3 = tl.load(s_rows + 4 * g + 3, mask=n_ok, other=0)[:, None] + 0 * t
    dw = tl.load(d_rows + g, mask=n_ok, other=0)[:, None]
    return words, words, w0, w1, w2, w3, dw


@triton.jit
def _group_term(words, high2, w0, w1, w2, w3, dw, xg, lanes, t, BLOCK_N: tl.constexpr, THREADS: tl.constexpr,
                CH: tl.constexpr, LANES: tl.constexpr, QTYPE: tl.constexpr, ASM: tl.constexpr):
    """One group's share of the product, float32 [BN, THREADS] (`_load_group`'s values; xg: the group's
    scratch): the float16 pair sums of codes * scale * x, summed into float32 and times d (Q4_K: minus
    dmin times the minimums' term)."""
    shifted = words >> 8
    part = tl.zeros((CH, BLOCK_N, THREADS, 4), dtype=tl.int32)  # float16 pairs, +0.0
    for jp in tl.static_range(4):
        codes = _plane_pair_codes(words, shifted, high2, jp, QTYPE)
        s, c = _scale_pairs(w0, w1, jp, QTYPE, ASM)
        x = tl.load(xg + jp * LANES + lanes)  # [CH, 1, THREADS, 4], the same for every row
        part = _weights_fma2(codes, s[None, :, :, None], c[None, :, :, None], x, part, ASM)
    part = _pair_sum(_pair_sum(part, 3, ASM), 0, ASM)  # [BN, THREADS]
    if QTYPE == 3:
        term = dw * (_half(part, False) + _half(part, True))
    else:
        low = _minimums(w2, w3, (xg + 4 * LANES).to(tl.pointer_type(tl.float32)), t, THREADS)
        term = _half(dw, False) * (_half(part, False) + _half(part, True)) - _half(dw, True) * low
    return term


@triton.jit(do_not_specialize=["stride_ysplit"])
def _h2_kernel(x_ptr, xp_ptr, c_ptr, h_ptr, s_ptr, d_ptr, y_ptr, N, stride_cn, stride_hn, stride_sn, stride_dn,
               stride_ysplit, QTYPE: tl.constexpr, GROUP: tl.constexpr, LANES: tl.constexpr, W_SCALE: tl.constexpr,
               STRIDE: tl.constexpr,
               SLICE_GROUPS: tl.constexpr, BLOCK_N: tl.constexpr, THREADS: tl.constexpr, REDUCE: tl.constexpr,
               NUM_STAGES: tl.constexpr, ASM: tl.constexpr, PDL: tl.constexpr = False, EARLY: tl.constexpr = False):
    # Program (pid_n, pid_k): weight rows pid_n * BLOCK_N.., groups pid_k * SLICE_GROUPS... REDUCE as
    # `triton_gguf_repacked._repacked_kernel`'s (0 store, 1 split-K partial, 2 atomic add).
    pid_k = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)
    n_ok = rn < N
    g_first = pid_k * SLICE_GROUPS
    g_end = g_first + SLICE_GROUPS
    # lanes [CH, 1, THREADS, 4]: chunk c of thread t holds lanes 4 (THREADS c + t) .. + 3
    CH: tl.constexpr = LANES // (4 * THREADS)
    lanes = (tl.arange(0, CH)[:, None, None, None] * (4 * THREADS) + tl.arange(0, THREADS)[None, None, :, None] * 4
             + tl.arange(0, 4)[None, None, None, :])
    row_words = c_ptr + rn64[None, :, None, None] * stride_cn + lanes  # [CH, BN, THREADS, 4]
    row_high = h_ptr + rn64[None, :, None, None] * stride_hn + lanes
    row_ok = n_ok[None, :, None, None]
    t = tl.arange(0, THREADS)[None, :]
    s_rows = s_ptr + rn64 * stride_sn
    d_rows = d_ptr + rn64 * stride_dn
    # NUM_STAGES 1: each group's loads, then its arithmetic; 0: the same, but the first group's loads
    # go out before x's preparation (they wait through it instead of after it); 2: the next group's
    # codes and scales are loaded into registers before this group's arithmetic (and the first before
    # x's preparation). EARLY (`pdl.early_weights`, stages 0 and 2): those first loads go out before the
    # wait for the previous kernel too (no kernel of a step writes a weight); everything else waits first.
    if NUM_STAGES != 1:
        if not EARLY:
            pdl.wait_for_previous(PDL)
        words, high2, w0, w1, w2, w3, dw = _load_group(row_words, row_high, row_ok, s_rows, d_rows, n_ok, g_first,
                                                       t, LANES, QTYPE)
        if EARLY:
            pdl.wait_for_previous(PDL)
    else:
        pdl.wait_for_previous(PDL)
    e = _slice_exponent(x_ptr, g_first * GROUP, SLICE_GROUPS * GROUP, GROUP)
    _write_slice_pairs(x_ptr, xp_ptr, g_first, SLICE_GROUPS, _pow2(-e), GROUP, LANES, STRIDE, QTYPE == 1)
    tl.debug_barrier()  # the slice's pairs (written by this program's threads) are read by all of them
    acc = tl.zeros((BLOCK_N, THREADS), dtype=tl.float32)
    g_loop = g_first
    if NUM_STAGES == 0:
        acc += _group_term(words, high2, w0, w1, w2, w3, dw, xp_ptr + g_first * STRIDE, lanes, t, BLOCK_N, THREADS,
                           CH, LANES, QTYPE, ASM)
        g_loop = g_first + 1
    for g in tl.range(g_loop, g_end, num_stages=1):
        if NUM_STAGES == 2:
            ahead = tl.minimum(g + 1, g_end - 1)  # the last turn loads its own group again (a cache hit)
            n_words, n_high2, n_w0, n_w1, n_w2, n_w3, n_dw = _load_group(row_words, row_high, row_ok, s_rows, d_rows,
                                                                         n_ok, ahead, t, LANES, QTYPE)
        else:
            words, high2, w0, w1, w2, w3, dw = _load_group(row_words, row_high, row_ok, s_rows, d_rows, n_ok, g, t,
                                                           LANES, QTYPE)
        acc += _group_term(words, high2, w0, w1, w2, w3, dw, xp_ptr + g * STRIDE, lanes, t, BLOCK_N, THREADS, CH,
                           LANES, QTYPE, ASM)
        if NUM_STAGES == 2:
            words, high2, w0, w1, w2, w3, dw = n_words, n_high2, n_w0, n_w1, n_w2, n_w3, n_dw
    total = tl.sum(acc, axis=1) * W_SCALE * _pow2(e)
    _store_partial(y_ptr, y_ptr + rn, total, n_ok, pid_k, stride_ysplit, REDUCE)


# Caps the kernel at 128 registers a thread (Triton's `maxnreg`). The shipped Q4_K pick (h2-n128-t1-s0, 4 warps,
# 512 programs) holds 165 with PDL's early weights (Triton 3.6, tools/sass_loop_count.py): three programs an SM,
# 396 at once on 132 SMs, so 512 programs run in 1.3 waves; at 128 (8 bytes spilled, none in the loop: 2.96
# instructions a weight against 2.94) four fit, 528 at once, one wave and a third more warps to hide the loads'
# latency. Off until measured on the device (#20's Q4_K_M B=1).
CAP_128_REGISTERS = False


def launch(x: torch.Tensor, codes, high, scales, d, target: torch.Tensor, n: int, qtype: str,
           groups_per_split: int, stride_split: int, grid: tuple[int, int], block_n: int, threads: int, reduce: int,
           stages: int, warps: int) -> None:
    """Mode "h2" of `triton_gguf_repacked.matmul_few_rows` (which checks the arguments and sums the
    split-K partials): x [1, K] times the Q4_K or Q6_K weight into `target`."""
    meta = kernel_constants(qtype)
    if meta["LANES"] % (4 * threads):
        raise ValueError(f'mode "h2" shares a group of {meta["LANES"]} words over at most {meta["LANES"] // 4} '
                         f'threads, not {threads}')
    scratch = torch.empty(x.shape[1] // meta["GROUP"] * meta["STRIDE"], dtype=torch.int32, device=x.device)
    _h2_kernel[grid](x, scratch, codes, high, scales, d, target, n, codes.stride(0), high.stride(0), scales.stride(0),
                     d.stride(0), stride_split, SLICE_GROUPS=groups_per_split, BLOCK_N=block_n, THREADS=threads,
                     REDUCE=reduce, NUM_STAGES=stages, ASM=x.device.type == "cuda", num_warps=warps, **meta,
                     **pdl.options(), EARLY=stages != 1 and pdl.early_weights(),
                     **({"maxnreg": 128} if CAP_128_REGISTERS else {}))
