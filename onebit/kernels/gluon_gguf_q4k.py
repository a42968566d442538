"""Mode "g16" of the packed GGUF products: Q4_K at 8-64 activation rows on Hopper's tensor cores, with
the dequantization of one sub-block overlapping the products of the one before (Gluon).

Mode "f16s" (`triton_gguf_f16`) dequantizes a 32-column plane of the weight tile into registers and
hands it to `tl.dot`, which compiles to wgmma with the weights as its register operand and then waits
for it (`WARPGROUP.DEPBAR.LE gsb0, 0x0`, nine times a group in its SASS): the CUDA cores dequantize,
then the tensor cores multiply, never both at once. Triton gives no control over that wait. Gluon
(`triton.experimental.gluon`) does: here each plane's wgmma is issued asynchronously and the wait
leaves one in flight, so the CUDA cores dequantize plane j + 1 while the tensor cores multiply plane j
(the registers of plane j stay reserved until its wait, through `warpgroup_mma_wait`'s deps).

Per 256-column group of the program's BLOCK_N weight rows (64 on one warp group, or 128 on two):
    x16 [BLOCK_M, 256] (float16, prepared as `triton_gguf_f16.prepare_x` prepares it) copied into shared
    memory asynchronously in one copy, a [BLOCK_M, 32] buffer a plane (wgmma's B operand, K-major), two
    groups' buffers so that the next group's copy runs during this group's products;
    plane j: weights float16(code * s16 - o16), s16 = float16(d * scale_j), o16 = float16(dmin * min_j),
    made in the register layout of wgmma's A operand (each thread reads the code words of its own rows
    and columns, 8 bytes at a time), two weights an instruction in inline PTX (`_dequant_plane`), then
    acc += weights @ x16_j.
The minimums are folded into the weights (mode "f16s" multiplies them by the sub-block means of x in a
ninth product), so a group is eight products. acc (float32) is multiplied by each row's 2**e at the end.
Many rows (prefill) stay with the dequantized weight and cuBLAS: these tiles over 128 activation rows
ran 0.33-0.95x that on the H200 (session 23). Reference: `gguf_repack.repacked_g16_linear_ref`. Gluon runs in no interpreter: on
the CPU the kernel is only compiled to sm_90 (tests/test_triton_sm90_compile.py checks its waits); its
numbers are checked on the device (tests/test_gguf_g16.py).
"""

from __future__ import annotations

import torch
import triton

try:  # Gluon came with Triton 3.5; without it the mode is not offered
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia import hopper
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = gl = hopper = async_copy = None

TYPES = ("Q4_K",)
MAX_ROWS = 64


def available() -> bool:
    """Whether this Triton has Gluon's Hopper wgmma."""
    return gluon is not None


if gluon is not None:
    GROUP = gl.constexpr(256)
    LANES = gl.constexpr(32)  # code words a group and row (one a column of each sub-block: nibble j = plane j)
    PLANES = gl.constexpr(8)
    # the CTA barrier: `thread_barrier` in Triton 3.5-3.6 (the H200 machines' 3.6.0), `barrier` later
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    # the asynchronous global -> shared copy: `async_copy_global_to_shared` in 3.6, `async_load` later
    _async_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    # a shared-memory view under another shape: `_reinterpret` in 3.6, `reinterpret` later
    _HAS_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

    @gluon.jit
    def _group_words(code_rows, s_rows, d_rows, g):
        """Group g's code words [BLOCK_N, LANES] and scale words (w0..w3, (d, dmin)) [BLOCK_N] of the rows."""
        return (gl.load(code_rows + g * LANES), gl.load(s_rows + 4 * g), gl.load(s_rows + 4 * g + 1),
                gl.load(s_rows + 4 * g + 2), gl.load(s_rows + 4 * g + 3), gl.load(d_rows + g))

    @gluon.jit
    def _copy_x_group(x_buffers, x_planes, g, x_ok):
        """Start the asynchronous copy of group g's x16 [BLOCK_M, 256] into x_buffers [PLANES, BLOCK_M, 32]
        in one copy (a copy a plane put a barrier between every two: their buffers might alias)."""
        _async_copy(x_buffers, x_planes + g * GROUP, mask=x_ok)
        async_copy.commit_group()

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
    def _g16_kernel(x_ptr, xe_ptr, c_ptr, s_ptr, d_ptr, y_ptr, M, N, GROUPS_PER_SPLIT, stride_xm, stride_cn,
                    stride_sn, stride_dn, stride_ym, stride_ysplit, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    REDUCE: gl.constexpr, PREFETCH: gl.constexpr, WARPS: gl.constexpr):
        # acc [BLOCK_N weight rows, BLOCK_M activation rows] in the wgmma accumulator's layout; the weights
        # are made in the layout of wgmma's register operand A, x16 read from shared memory (operand B).
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        rows_a: gl.constexpr = gl.SliceLayout(1, a_layout)
        cols_a: gl.constexpr = gl.SliceLayout(0, a_layout)
        x_load: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 8, 4], [WARPS, 1, 1], [2, 1, 0])
        x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        x_group_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=3)

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_a)
        rn64 = gl.where(rn < N, rn, 0).to(gl.int64)  # rows past N read row 0 (never stored)
        lane = gl.arange(0, LANES, layout=cols_a)
        code_rows = c_ptr + rn64[:, None] * stride_cn + lane[None, :]  # [BLOCK_N, LANES] in A's layout
        s_rows = s_ptr + rn64 * stride_sn
        d_rows = d_ptr + rn64 * stride_dn

        # x16's group as [PLANES, BLOCK_M, LANES] pointers, 8 columns (16 bytes) a thread
        plane = gl.arange(0, PLANES, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_load)))
        xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(2, x_load)))
        xk = gl.arange(0, LANES, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_load)))
        x_planes = (x_ptr + xm[None, :, None].to(gl.int64) * stride_xm + plane[:, None, None] * LANES
                    + xk[None, None, :])
        x_ok = (xm[None, :, None] < M) & (xk[None, None, :] < LANES) & (plane[:, None, None] < PLANES)
        # two groups' x16, a [BLOCK_M, 32] buffer a plane: the next group's copy runs during this one's products
        x_smem = gl.allocate_shared_memory(gl.float16, [2 * PLANES, BLOCK_M, LANES], x_shared)
        # the same bytes as two groups of [PLANES, BLOCK_M, LANES], for the one copy a group
        if _HAS_REINTERPRET:
            x_groups = x_smem.reinterpret(gl.float16, [2, PLANES, BLOCK_M, LANES], x_group_shared)
        else:
            x_groups = x_smem._reinterpret(gl.float16, [2, PLANES, BLOCK_M, LANES], x_group_shared)

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        first = pid_k * GROUPS_PER_SPLIT
        last = first + GROUPS_PER_SPLIT - 1
        _copy_x_group(x_groups.index(0), x_planes, first, x_ok)
        words, w0, w1, w2, w3, dw = _group_words(code_rows, s_rows, d_rows, first)
        for g in range(first, last + 1):
            buffer = (g - first) % 2
            _copy_x_group(x_groups.index(1 - buffer), x_planes, g + 1, x_ok & (g < last))  # none after the last
            if PREFETCH:  # the next group's words into registers now (the last turn reloads its own)
                n_words, n_w0, n_w1, n_w2, n_w3, n_dw = _group_words(code_rows, s_rows, d_rows,
                                                                     gl.minimum(g + 1, last))
            async_copy.wait_group(1)  # this group's x16 is in (the next group's copy may still run)
            hopper.fence_async_shared()
            _cta_barrier()
            d16 = (dw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True)
            neg_dmin16 = -(((dw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True))
            for j in gl.static_range(PLANES):
                if j < 4:
                    sc = (w0 >> (8 * j)) & 0xFF
                    mn = (w2 >> (8 * j)) & 0xFF
                else:
                    sc = (w1 >> (8 * (j - 4))) & 0xFF
                    mn = (w3 >> (8 * (j - 4))) & 0xFF
                # the 6-bit scale and minimum as float16 without a conversion instruction (1024 + v, minus
                # 1024), their products with d and -dmin in float16: rounded once, as float32 then float16
                s16 = d16 * (_as_f16_plus_1024(sc) - 1024.0)
                neg_o16 = neg_dmin16 * (_as_f16_plus_1024(mn) - 1024.0)
                w = _dequant_plane(words, s16[:, None], neg_o16[:, None], j)
                acc = hopper.warpgroup_mma(w, x_smem.index(buffer * PLANES + j).permute((1, 0)), acc, is_async=True)
                acc, w = hopper.warpgroup_mma_wait(num_outstanding=1, deps=[acc, w])
            # every product of this group done and every warp past it before its buffers take group g + 2
            acc = hopper.warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            _cta_barrier()
            if PREFETCH:
                words, w0, w1, w2, w3, dw = n_words, n_w0, n_w1, n_w2, n_w3, n_dw
            else:
                words, w0, w1, w2, w3, dw = _group_words(code_rows, s_rows, d_rows, gl.minimum(g + 1, last))
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


def launch(x16: torch.Tensor, xe: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, d: torch.Tensor,
           target: torch.Tensor, n: int, groups_per_split: int, stride_t: int, stride_split: int,
           grid: tuple[int, int], block_n: int, reduce: int, prefetch: bool, warps: int = 4) -> None:
    """Mode "g16" of `triton_gguf_repacked.matmul_few_rows`: x16 [M, K] float16 (M <= MAX_ROWS) and its
    row scales xe (`triton_gguf_f16.prepare_x`) times the Q4_K weight into `target` (reduce 0: the
    output; 1: split-K partials [split, M, N] float32, summed by the caller); prefetch: load the next
    group's code words into registers during this group's products (32 more registers a thread at 128
    rows a warp group: they spill there); warps: 4 (one warp group) or 8 (two, each its own 64 rows of
    block_n = 128, sharing one copy of x16)."""
    _check_tile(block_n, warps)
    m = x16.shape[0]
    _g16_kernel[grid](
        x16, xe, codes, scales, d, target, m, n, groups_per_split, x16.stride(0), codes.stride(0), scales.stride(0),
        d.stride(0), stride_t, stride_split, BLOCK_M=max(8, triton.next_power_of_2(m)), BLOCK_N=block_n,
        REDUCE=reduce, PREFETCH=prefetch, WARPS=warps, num_warps=warps)


def _check_tile(block_n: int, warps: int) -> None:
    if warps not in (4, 8) or block_n not in (64, 128) or block_n < 16 * warps:
        raise ValueError(f'mode "g16" runs 64 or 128 weight rows a program on 4 or 8 warps (16 rows a warp at '
                         f'least), not {block_n} on {warps}')


def compile_sm90(block_m: int, block_n: int, reduce: int, prefetch: bool, warps: int = 4):
    """`_g16_kernel` compiled ahead of time for the H200 (sm_90; no GPU needed), specialized as a launch
    specializes it: pointers and strides divisible by 16 (x16's rows: K a multiple of 256; without it the
    x copy could not be 16-byte cp.async). For the offline SASS counts (tools/sass_loop_count.py) and
    the compile test (tests/test_triton_sm90_compile.py). Returns Triton's compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    _check_tile(block_n, warps)
    fn = _g16_kernel
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "REDUCE": reduce, "PREFETCH": prefetch, "WARPS": warps}
    types = {"x_ptr": "*fp16", "xe_ptr": "*fp32", "c_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*i32", "y_ptr": "*fp32"}
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in fn.arg_names
             if name.endswith("_ptr") or name.startswith("stride_")}
    return triton.compile(GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
