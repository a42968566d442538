"""Mode "g16" of the packed GGUF products: Q4_K and Q6_K at 8-64 activation rows on Hopper's tensor cores,
with the dequantization of one sub-block overlapping the products of the one before (Gluon).

Mode "f16s" (`triton_gguf_f16`) dequantizes a 32-column plane of the weight tile into registers and
hands it to `tl.dot`, which compiles to wgmma with the weights as its register operand and then waits
for it (`WARPGROUP.DEPBAR.LE gsb0, 0x0`, nine times a group in its SASS): the CUDA cores dequantize,
then the tensor cores multiply, never both at once. Triton gives no control over that wait. Gluon
(`triton.experimental.gluon`) does: here each plane's wgmma is issued asynchronously and the wait
leaves one in flight, so the CUDA cores dequantize plane j + 1 while the tensor cores multiply plane j
(the registers of plane j stay reserved until its wait, through `warpgroup_mma_wait`'s deps).

Per 256-column super-block (a loop turn) of the program's BLOCK_N weight rows (64 on one warp group, or 128
on two), in planes of LANES columns with one scale each (Q4_K: 8 of 32; Q6_K: 16 of 16):
    x16 [BLOCK_M, 256] (float16, prepared as `triton_gguf_f16.prepare_x` prepares it) copied into shared
    memory asynchronously in one copy, a [BLOCK_M, LANES] buffer a plane (wgmma's B operand, K-major), two
    turns' buffers so that the next turn's copy runs during this turn's products;
    plane j: weights float16(code * s16 - o16), s16 = float16(d * scale_j), o16 = float16(dmin * min_j)
    (Q6_K: float16((code - 32) * s16), no minimums, as mode "f16s" rounds them),
    made in the register layout of wgmma's A operand (each thread reads the code words of its own rows
    and columns, 8 bytes at a time), two weights an instruction in inline PTX (`_dequant_plane`), then
    acc += weights @ x16_j.
Q4_K's minimums are folded into the weights (mode "f16s" multiplies them by the sub-block means of x in
a ninth product), so a super-block is eight products (Q6_K: sixteen). acc (float32) is multiplied by
each row's 2**e at the end. Many rows (prefill) stay with the dequantized weight and cuBLAS: tiles of
this kernel over 128 activation rows ran 0.33-0.95x that on the H200 (session 23).
Reference: `gguf_repack.repacked_g16_linear_ref`. Gluon runs in no interpreter: on the CPU the kernel
is only compiled to sm_90 (tests/test_triton_sm90_compile.py checks its waits); its numbers are
checked on the device (tests/test_gguf_g16.py).
"""

from __future__ import annotations

import functools
import logging

import torch
import triton

try:  # Gluon came with Triton 3.5; without it the mode is not offered
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia import hopper
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = gl = hopper = async_copy = None

TYPES = ("Q4_K", "Q6_K")
# per type: (columns a group, code words a group and row): Q4_K one 256-column super-block of eight 32-column
# sub-blocks, Q6_K half a super-block, eight 16-column sub-blocks (`gguf_repack.GROUPING`)
SHAPES = {"Q4_K": (256, 32), "Q6_K": (128, 16)}
MAX_ROWS = 64


log = logging.getLogger(__name__)


def available() -> bool:
    """Whether this Triton has Gluon's Hopper wgmma."""
    return gluon is not None


@functools.lru_cache(maxsize=None)
def compiles() -> bool:
    """Whether this Triton compiles the kernel (Gluon's API moves between releases: the shims above cover
    3.6 and 3.9); checked once, ahead of time, so that a Triton it does not cover costs a logged warning
    and the f16s kernels instead of a failed start-up."""
    if not available():
        return False
    try:
        compile_sm90(8, 64, 1, 2)
    except Exception as error:  # noqa: BLE001 - any failure of the compiler means the same thing here
        log.warning('mode "g16" does not compile with Triton %s (%s: %s); its picks run as mode "f16s"',
                    triton.__version__, type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return False
    return True


if gluon is not None:
    # the CTA barrier: `thread_barrier` in Triton 3.5-3.6 (the H200 machines' 3.6.0), `barrier` later
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # the asynchronous global -> shared copy: `async_copy_global_to_shared` in 3.6, `async_load` later
    _async_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    # a shared-memory view under another shape: `_reinterpret` in 3.6, `reinterpret` later
    _HAS_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

    @gluon.jit
    def _turn_codes(code_rows, high_rows, t, LANES: gl.constexpr, Q6: gl.constexpr):
        """Super-block t's (256 columns') code words of the rows, a and b [BLOCK_N, LANES] (Q4_K: one group of
        32 lanes, a = b; Q6_K: its two 128-column groups of 16), and their top bits (Q6_K: int16 [BLOCK_N,
        LANES] each; Q4_K: the words again, unused). Both types keep 32 words a row a super-block."""
        words_a = gl.load(code_rows + t * 32)
        if Q6:
            words_b = gl.load(code_rows + t * 32 + LANES)
            high_a = gl.load(high_rows + t * 32)
            high_b = gl.load(high_rows + t * 32 + LANES)
        else:
            words_b = words_a
            high_a = words_a
            high_b = words_a
        return words_a, words_b, high_a, high_b

    @gluon.jit
    def _turn_scales(s_rows, d_rows, t):
        """Super-block t's four scale words w0..w3 [BLOCK_N] (Q4_K: scales 0-3, 4-7, minimums 0-3, 4-7; Q6_K:
        its sixteen int8 scales) and d (Q4_K: the word (d, dmin); Q6_K: a float32)."""
        return (gl.load(s_rows + 4 * t), gl.load(s_rows + 4 * t + 1), gl.load(s_rows + 4 * t + 2),
                gl.load(s_rows + 4 * t + 3), gl.load(d_rows + t))

    @gluon.jit
    def _copy_turn(x_buffers, x_planes, x_ok, t, last):
        """Start the asynchronous copy of super-block t's x16 [BLOCK_M, 256] (none past `last`) into x_buffers
        [planes, BLOCK_M, LANES], in one copy (a copy a plane put a barrier between every two: their buffers
        might alias) and one commit group."""
        _async_copy(x_buffers, x_planes + t * 256, mask=x_ok & (t <= last))
        async_copy.commit_group()

    @gluon.jit
    def _scale_byte(w0, w1, w2, w3, i: gl.constexpr):
        """Byte i (0-15) of the four scale words w0..w3 (bytes 0-3 of w0 first), as int32 0..255."""
        if i < 4:
            word = w0
        elif i < 8:
            word = w1
        elif i < 12:
            word = w2
        else:
            word = w3
        return (word >> (8 * (i % 4))) & 0xFF

    @gluon.jit
    def _as_f16_plus_1024(v):
        """1024 + v as float16 (v an integer 0..1023): v in the mantissa of 1024's bit pattern."""
        return (v | 0x6400).to(gl.int16).to(gl.float16, bitcast=True)

    @gluon.jit
    def _dequant_plane(words, s16, neg_o16, j: gl.constexpr):
        """Plane j's float16 weights code * s16 - o16 [BLOCK_N, LANES] (code: nibble j of each word), two
        at a time in inline PTX: the two words' half-words holding nibble j side by side (prmt), the
        nibbles into 1024's mantissa (lop3), minus 1024 (exact), then one fma.rn.f16x2 (one rounding).
        Element-wise, so correct whichever two elements a call gets; wgmma's A layout (k_width 2) hands it
        the K-adjacent pairs it keeps in one register."""
        # the half-word selector and the shift are constants passed as registers (ptxas folds them)
        select = 0x5410 if j < 4 else 0x7632
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, k;\n"
            "prmt.b32 t, $1, $2, $5;\n"
            "shr.u32 t, t, $7;\n"
            "lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA;\n"  # (t & 0x000F000F) | 0x64006400
            "mov.b32 k, 0x64006400;\n"
            "sub.f16x2 t, t, k;\n"
            "fma.rn.f16x2 $0, t, $3, $4; }",
            "=r,r,r,r,r,r,r,r,r", [words, s16, neg_o16, select, 4 * (j % 4)], dtype=gl.float16, is_pure=True,
            pack=2)

    @gluon.jit
    def _dequant_plane_q6(words, high, s16, j: gl.constexpr):
        """Q6_K's plane j: float16 weights (code - 32) * s16 [BLOCK_N, LANES], the code's low four bits
        nibble j of each word and its top two bits 2j, 2j + 1 of the int16 `high`; as `_dequant_plane`,
        with the top bits moved to bits 4 and 5 of the mantissa (a second lop3), minus 1056 (exact), then
        one mul.rn.f16x2 (one rounding, as mode "f16s" rounds Q6_K)."""
        select = 0x5410 if j < 4 else 0x7632
        # the top bits 2j, 2j + 1 moved to 4, 5: left for j <= 2, else right (the mask then keeps each half's
        # own bits; the shift by 0 is folded away)
        left = 4 - 2 * j if j <= 2 else 0
        right = 2 * j - 4 if j > 2 else 0
        return gl.inline_asm_elementwise(
            "{ .reg .b32 t, h, k;\n"
            "prmt.b32 t, $1, $2, $5;\n"
            "shr.u32 t, t, $7;\n"
            "lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA;\n"
            "shl.b32 h, $3, $9;\n"
            "shr.u32 h, h, $11;\n"
            "lop3.b32 t, h, 0x00300030, t, 0xEA;\n"  # (h & 0x00300030) | t
            "mov.b32 k, 0x64206420;\n"
            "sub.f16x2 t, t, k;\n"
            "mul.rn.f16x2 $0, t, $4; }",
            "=r,r,r,r,r,r,r,r,r,r,r,r,r", [words, high, s16, select, 4 * (j % 4), left, right], dtype=gl.float16,
            is_pure=True, pack=2)

    @gluon.jit
    def _turn_products(acc, x_smem, first_plane, words_a, words_b, high_a, high_b, w0, w1, w2, w3, dw,
                       TURN_PLANES: gl.constexpr, Q6: gl.constexpr):
        """acc + one super-block's products: each plane's weights dequantized, then its wgmma issued
        asynchronously and waited for down to one in flight (the next plane's dequantization overlaps it);
        the turn's x16: x_smem's TURN_PLANES buffers [BLOCK_M, LANES] from first_plane."""
        if Q6:
            d16 = dw.to(gl.float16)  # exact: a float16 in the file
        else:
            d16 = (dw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True)
            neg_dmin16 = -(((dw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True))
        for p in gl.static_range(TURN_PLANES):
            # the scale (and minimum) as float16 without a conversion instruction (1024 + v, minus 1024;
            # Q6_K's signed byte as 1024 + 128 + sc, minus 1152), the products with d and -dmin in
            # float16: rounded once, as float32 then float16
            if Q6:  # plane p: group p // 8's nibble p % 8; scale byte p of w0..w3
                s16 = d16 * (_as_f16_plus_1024(_scale_byte(w0, w1, w2, w3, p) ^ 0x80) - 1152.0)
                if p < 8:
                    w = _dequant_plane_q6(words_a, high_a, s16[:, None], p)
                else:
                    w = _dequant_plane_q6(words_b, high_b, s16[:, None], p - 8)
            else:  # plane p: nibble p; scale byte p of w0, w1, minimum byte p of w2, w3 (byte 8 + p)
                sc = _scale_byte(w0, w1, w2, w3, p)
                mn = _scale_byte(w0, w1, w2, w3, 8 + p)
                s16 = d16 * (_as_f16_plus_1024(sc) - 1024.0)
                neg_o16 = neg_dmin16 * (_as_f16_plus_1024(mn) - 1024.0)
                w = _dequant_plane(words_a, s16[:, None], neg_o16[:, None], p)
            acc = hopper.warpgroup_mma(w, x_smem.index(first_plane + p).permute((1, 0)), acc, is_async=True)
            acc, w = hopper.warpgroup_mma_wait(num_outstanding=1, deps=[acc, w])
        return hopper.warpgroup_mma_wait(num_outstanding=0, deps=[acc])

    @gluon.jit
    def _g16_kernel(x_ptr, xe_ptr, c_ptr, h_ptr, s_ptr, d_ptr, y_ptr, M, N, TURNS_PER_SPLIT, stride_xm, stride_cn,
                    stride_hn, stride_sn, stride_dn, stride_ym, stride_ysplit, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, REDUCE: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
                    LANES: gl.constexpr, Q6: gl.constexpr):
        # acc [BLOCK_N weight rows, BLOCK_M activation rows] in the wgmma accumulator's layout; the weights
        # are made in the layout of wgmma's register operand A, x16 read from shared memory (operand B).
        # A loop turn is one 256-column super-block: TURN_PLANES planes of LANES columns, a wgmma each.
        # STAGES 1: a turn's code words and scales loaded into registers after the turn before it; 2: during
        # it (prefetched). x16 goes through shared memory one turn ahead either way.
        TURN_PLANES: gl.constexpr = 256 // LANES
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        rows_a: gl.constexpr = gl.SliceLayout(1, a_layout)
        cols_a: gl.constexpr = gl.SliceLayout(0, a_layout)
        # x16's copy: 8 columns (16 bytes) a thread, a plane's LANES columns over LANES / 8 threads
        x_load: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 32 // (LANES // 8), LANES // 8], [WARPS, 1, 1],
                                                [2, 1, 0])
        x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * LANES, element_bitwidth=16, rank=2)
        x_turn_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * LANES, element_bitwidth=16,
                                                           rank=3)

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_a)
        rn64 = gl.where(rn < N, rn, 0).to(gl.int64)  # rows past N read row 0 (never stored)
        lane = gl.arange(0, LANES, layout=cols_a)
        code_rows = c_ptr + rn64[:, None] * stride_cn + lane[None, :]  # [BLOCK_N, LANES] in A's layout
        high_rows = h_ptr + rn64[:, None] * stride_hn + lane[None, :]
        s_rows = s_ptr + rn64 * stride_sn
        d_rows = d_ptr + rn64 * stride_dn

        # x16's super-block as [TURN_PLANES, BLOCK_M, LANES] pointers
        plane = gl.arange(0, TURN_PLANES, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_load)))
        xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_load)))
        xk = gl.arange(0, LANES, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_load)))
        x_planes = (x_ptr + xm[None, :, None].to(gl.int64) * stride_xm + plane[:, None, None] * LANES
                    + xk[None, None, :])
        x_ok = (xm[None, :, None] < M) & (xk[None, None, :] < LANES) & (plane[:, None, None] < TURN_PLANES)
        # two turns' x16, a [BLOCK_M, LANES] buffer a plane: the next turn's copy runs during this one's products
        x_smem = gl.allocate_shared_memory(gl.float16, [2 * TURN_PLANES, BLOCK_M, LANES], x_shared)
        # the same bytes as two turns of [TURN_PLANES, BLOCK_M, LANES], for the one copy a turn
        if _HAS_REINTERPRET:
            x_turns = x_smem.reinterpret(gl.float16, [2, TURN_PLANES, BLOCK_M, LANES], x_turn_shared)
        else:
            x_turns = x_smem._reinterpret(gl.float16, [2, TURN_PLANES, BLOCK_M, LANES], x_turn_shared)

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        first = pid_k * TURNS_PER_SPLIT
        last = first + TURNS_PER_SPLIT - 1
        _copy_turn(x_turns.index(0), x_planes, x_ok, first, last)
        words_a, words_b, high_a, high_b = _turn_codes(code_rows, high_rows, first, LANES, Q6)
        w0, w1, w2, w3, dw = _turn_scales(s_rows, d_rows, first)
        for t in range(first, last + 1):
            slot = (t - first) % 2
            _copy_turn(x_turns.index(1 - slot), x_planes, x_ok, t + 1, last)  # the slot the turn before read
            if STAGES >= 2:  # the next turn's words and scales into registers now
                n_w0, n_w1, n_w2, n_w3, n_dw = _turn_scales(s_rows, d_rows, gl.minimum(t + 1, last))
                n_words_a, n_words_b, n_high_a, n_high_b = _turn_codes(code_rows, high_rows,
                                                                       gl.minimum(t + 1, last), LANES, Q6)
            async_copy.wait_group(1)  # this turn's copy is in (the next one's may still run)
            hopper.fence_async_shared()
            _cta_barrier()
            acc = _turn_products(acc, x_smem, slot * TURN_PLANES, words_a, words_b, high_a, high_b, w0, w1, w2,
                                 w3, dw, TURN_PLANES, Q6)
            # every product of this turn done and every warp past it before its slot takes turn t + 2
            _cta_barrier()
            if STAGES >= 2:
                w0, w1, w2, w3, dw = n_w0, n_w1, n_w2, n_w3, n_dw
                words_a, words_b, high_a, high_b = n_words_a, n_words_b, n_high_a, n_high_b
            else:
                words_a, words_b, high_a, high_b = _turn_codes(code_rows, high_rows, gl.minimum(t + 1, last),
                                                               LANES, Q6)
                w0, w1, w2, w3, dw = _turn_scales(s_rows, d_rows, gl.minimum(t + 1, last))
        async_copy.wait_group(0)
        rm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
        acc = acc * gl.load(xe_ptr + rm, mask=rm < M, other=1.0)[None, :]
        on = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma))
        ok = (rm[None, :] < M) & (on[:, None] < N)
        out = y_ptr + rm[None, :] * stride_ym + on[:, None]
        if REDUCE == 0:
            gl.store(out, acc.to(y_ptr.dtype.element_ty), mask=ok)
        else:
            gl.store(out + pid_k * stride_ysplit, acc, mask=ok)


def launch(x16: torch.Tensor, xe: torch.Tensor, codes: torch.Tensor, high: torch.Tensor, scales: torch.Tensor,
           d: torch.Tensor, target: torch.Tensor, n: int, qtype: str, groups_per_split: int, stride_t: int,
           stride_split: int, grid: tuple[int, int], block_n: int, reduce: int, stages: int,
           warps: int = 4) -> None:
    """Mode "g16" of `triton_gguf_repacked.matmul_few_rows`: x16 [M, K] float16 (M <= MAX_ROWS) and its
    row scales xe (`triton_gguf_f16.prepare_x`) times the Q4_K or Q6_K weight (`RepackedMatrix`'s tensors)
    into `target` (Q4_K's high: any int32 tensor, never read; reduce 0: the output; 1: split-K partials
    [split, M, N] float32, summed by the caller). stages: 1, a turn's code words and scales loaded after
    the turn before; 2, prefetched into registers during it (32 more registers a thread at 128 rows a warp
    group: they spill there). warps: 4 (one warp group) or 8 (two, each its own 64 rows of block_n = 128,
    sharing one copy of x16)."""
    _check_tile(block_n, warps)
    if stages not in (1, 2):
        raise ValueError(f'mode "g16" takes 1 or 2 stages, not {stages}')
    group, lanes = SHAPES[qtype]
    if groups_per_split * group % 256:
        raise ValueError(f'mode "g16" walks whole 256-column super-blocks: {groups_per_split} groups of {qtype} '
                         f'a split program are not')
    m = x16.shape[0]
    _g16_kernel[grid](
        x16, xe, codes, high, scales, d, target, m, n, groups_per_split * group // 256, x16.stride(0),
        codes.stride(0), high.stride(0), scales.stride(0), d.stride(0), stride_t, stride_split,
        BLOCK_M=max(8, triton.next_power_of_2(m)), BLOCK_N=block_n, REDUCE=reduce, STAGES=stages, WARPS=warps,
        LANES=lanes, Q6=qtype == "Q6_K", num_warps=warps)


def _check_tile(block_n: int, warps: int) -> None:
    if warps not in (4, 8) or block_n not in (64, 128) or block_n < 16 * warps:
        raise ValueError(f'mode "g16" runs 64 or 128 weight rows a program on 4 or 8 warps (16 rows a warp at '
                         f'least), not {block_n} on {warps}')


def compile_sm90(block_m: int, block_n: int, reduce: int, stages: int, warps: int = 4, qtype: str = "Q4_K"):
    """`_g16_kernel` compiled ahead of time for the H200 (sm_90; no GPU needed), specialized as a launch
    specializes it: pointers and strides divisible by 16 (x16's rows: K a multiple of 256; without it the
    x copy could not be 16-byte cp.async). For the offline SASS counts (tools/sass_loop_count.py) and
    the compile test (tests/test_triton_sm90_compile.py). Returns Triton's compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    _check_tile(block_n, warps)
    fn = _g16_kernel
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "REDUCE": reduce, "STAGES": stages, "WARPS": warps,
                  "LANES": SHAPES[qtype][1], "Q6": qtype == "Q6_K"}
    q6 = qtype == "Q6_K"
    types = {"x_ptr": "*fp16", "xe_ptr": "*fp32", "c_ptr": "*i32", "h_ptr": "*i16" if q6 else "*i32",
             "s_ptr": "*i32", "d_ptr": "*fp32" if q6 else "*i32", "y_ptr": "*fp32"}
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in fn.arg_names
             if name.endswith("_ptr") or name.startswith("stride_")}
    return triton.compile(GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
