"""Mode "g16" of the packed GGUF products: Q4_K at 8-64 activation rows on Hopper's tensor cores, with
the dequantization of one sub-block overlapping the products of the one before (Gluon).

Mode "f16s" (`triton_gguf_f16`) dequantizes a 32-column plane of the weight tile into registers and
hands it to `tl.dot`, which compiles to wgmma with the weights as its register operand and then waits
for it (`WARPGROUP.DEPBAR.LE gsb0, 0x0`, nine times a group in its SASS): the CUDA cores dequantize,
then the tensor cores multiply, never both at once. Triton gives no control over that wait. Gluon
(`triton.experimental.gluon`) does: here each plane's wgmma is issued asynchronously and the wait
leaves one in flight, so the CUDA cores dequantize plane j + 1 while the tensor cores multiply plane j
(the registers of plane j stay reserved until its wait, through `warpgroup_mma_wait`'s deps).

Per 256-column group of the program's BLOCK_N weight rows:
    x16 [BLOCK_M, 256] (float16, prepared as `triton_gguf_f16.prepare_x` prepares it) copied into shared
    memory asynchronously, one [BLOCK_M, 32] buffer a plane (wgmma's B operand, K-major), two groups'
    buffers so that the next group's copy runs during this group's products;
    plane j: weights float16(code * s16 - o16), s16 = float16(d * scale_j), o16 = float16(dmin * min_j),
    made in the register layout of wgmma's A operand (each thread reads the code words of its own rows
    and columns, 8 bytes at a time), then acc += weights @ x16_j.
The minimums are folded into the weights (mode "f16s" multiplies them by the sub-block means of x in a
ninth product), so a group is eight products. acc (float32) is multiplied by each row's 2**e at the end.
A third grid axis walks the activation rows in tiles, so the same kernel serves prefill chunks
(`matmul_tiles`). Reference: `gguf_repack.repacked_g16_linear_ref`. Gluon runs in no interpreter: on
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
WARPS = 4  # one warp group


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

    @gluon.jit
    def _group_words(code_rows, s_rows, d_rows, g):
        """Group g's code words [BLOCK_N, LANES] and scale words (w0..w3, (d, dmin)) [BLOCK_N] of the rows."""
        return (gl.load(code_rows + g * LANES), gl.load(s_rows + 4 * g), gl.load(s_rows + 4 * g + 1),
                gl.load(s_rows + 4 * g + 2), gl.load(s_rows + 4 * g + 3), gl.load(d_rows + g))

    @gluon.jit
    def _copy_x_group(x_smem, first_buffer, x_rows, g, x_ok):
        """Start the asynchronous copy of group g's x16 [BLOCK_M, 256] into buffers first_buffer.. (a plane each)."""
        for j in gl.static_range(PLANES):
            _async_copy(x_smem.index(first_buffer + j), x_rows + g * GROUP + j * LANES, mask=x_ok)
        async_copy.commit_group()

    @gluon.jit
    def _g16_kernel(x_ptr, xe_ptr, c_ptr, s_ptr, d_ptr, y_ptr, M, N, GROUPS_PER_SPLIT, stride_xm, stride_cn,
                    stride_sn, stride_dn, stride_ym, stride_ysplit, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    REDUCE: gl.constexpr, PREFETCH: gl.constexpr = False):
        # acc [BLOCK_N weight rows, BLOCK_M activation rows] in the wgmma accumulator's layout; the weights
        # are made in the layout of wgmma's register operand A, x16 read from shared memory (operand B).
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_M, 16])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        rows_a: gl.constexpr = gl.SliceLayout(1, a_layout)
        cols_a: gl.constexpr = gl.SliceLayout(0, a_layout)
        x_load: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
        x_shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)

        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        m0 = gl.program_id(2) * BLOCK_M  # activation rows m0.. (one tile up to BLOCK_M rows)
        rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_a)
        rn64 = gl.where(rn < N, rn, 0).to(gl.int64)  # rows past N read row 0 (never stored)
        lane = gl.arange(0, LANES, layout=cols_a)
        code_rows = c_ptr + rn64[:, None] * stride_cn + lane[None, :]  # [BLOCK_N, LANES] in A's layout
        s_rows = s_ptr + rn64 * stride_sn
        d_rows = d_ptr + rn64 * stride_dn

        xm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_load))
        xk = gl.arange(0, LANES, layout=gl.SliceLayout(0, x_load))
        x_rows = x_ptr + xm[:, None].to(gl.int64) * stride_xm + xk[None, :]
        x_ok = (xm[:, None] < M) & (xk[None, :] < LANES)
        # two groups' x16, a [BLOCK_M, 32] buffer a plane: the next group's copy runs during this one's products
        x_smem = gl.allocate_shared_memory(gl.float16, [2 * PLANES, BLOCK_M, LANES], x_shared)

        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=mma)
        first = pid_k * GROUPS_PER_SPLIT
        last = first + GROUPS_PER_SPLIT - 1
        _copy_x_group(x_smem, 0, x_rows, first, x_ok)
        words, w0, w1, w2, w3, dw = _group_words(code_rows, s_rows, d_rows, first)
        for g in range(first, last + 1):
            buffer = ((g - first) % 2) * PLANES
            _copy_x_group(x_smem, PLANES - buffer, x_rows, g + 1, x_ok & (g < last))  # none after the last
            if PREFETCH:  # the next group's words into registers now (the last turn reloads its own)
                n_words, n_w0, n_w1, n_w2, n_w3, n_dw = _group_words(code_rows, s_rows, d_rows,
                                                                     gl.minimum(g + 1, last))
            async_copy.wait_group(1)  # this group's x16 is in (the next group's copy may still run)
            hopper.fence_async_shared()
            _cta_barrier()
            d = (dw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            dmin = ((dw >> 16) & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            for j in gl.static_range(PLANES):
                if j < 4:
                    sc = (w0 >> (8 * j)) & 0xFF
                    mn = (w2 >> (8 * j)) & 0xFF
                else:
                    sc = (w1 >> (8 * (j - 4))) & 0xFF
                    mn = (w3 >> (8 * (j - 4))) & 0xFF
                s16 = (d * sc.to(gl.float32)).to(gl.float16)
                o16 = (dmin * mn.to(gl.float32)).to(gl.float16)
                # 1024 + code as a float16 bit pattern, minus 1024: the code, exactly
                q = ((((words >> (4 * j)) & 0xF) | 0x6400).to(gl.int16).to(gl.float16, bitcast=True)
                     - 1024.0)
                w = q * s16[:, None] - o16[:, None]
                acc = hopper.warpgroup_mma(w, x_smem.index(buffer + j).permute((1, 0)), acc, is_async=True)
                acc, w = hopper.warpgroup_mma_wait(num_outstanding=1, deps=[acc, w])
            # every product of this group done and every warp past it before its buffers take group g + 2
            acc = hopper.warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            _cta_barrier()
            if PREFETCH:
                words, w0, w1, w2, w3, dw = n_words, n_w0, n_w1, n_w2, n_w3, n_dw
            else:
                words, w0, w1, w2, w3, dw = _group_words(code_rows, s_rows, d_rows, gl.minimum(g + 1, last))
        async_copy.wait_group(0)
        rm = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, mma))
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
           grid: tuple[int, int], block_n: int, reduce: int, prefetch: bool, block_m: int | None = None) -> None:
    """Mode "g16" of `triton_gguf_repacked.matmul_few_rows`: x16 [M, K] float16 and its row scales xe
    (`triton_gguf_f16.prepare_x`) times the Q4_K weight into `target` (reduce 0: the output; 1: split-K
    partials [split, M, N] float32, summed by the caller); prefetch: load the next group's code words
    into registers during this group's products (32 more registers a thread at 128 rows a program: they
    spill there, so the configs use it at 64). block_m: activation rows a program (default: all M, at
    most MAX_ROWS), the grid's third axis walking M in such tiles."""
    m = x16.shape[0]
    block_m = block_m or max(8, triton.next_power_of_2(m))
    _g16_kernel[grid + (triton.cdiv(m, block_m),)](
        x16, xe, codes, scales, d, target, m, n, groups_per_split, x16.stride(0), codes.stride(0), scales.stride(0),
        d.stride(0), stride_t, stride_split, BLOCK_M=block_m, BLOCK_N=block_n, REDUCE=reduce, PREFETCH=prefetch,
        num_warps=WARPS)


def compile_sm90(block_m: int, block_n: int, reduce: int, prefetch: bool):
    """`_g16_kernel` compiled ahead of time for the H200 (sm_90; no GPU needed), specialized as a launch
    specializes it: pointers and strides divisible by 16 (x16's rows: K a multiple of 256; without it the
    x copy could not be 16-byte cp.async). For the offline SASS counts (tools/sass_loop_count.py) and
    the compile test (tests/test_triton_sm90_compile.py). Returns Triton's compiled kernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _g16_kernel
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "REDUCE": reduce, "PREFETCH": prefetch}
    types = {"x_ptr": "*fp16", "xe_ptr": "*fp32", "c_ptr": "*i32", "s_ptr": "*i32", "d_ptr": "*i32", "y_ptr": "*fp32"}
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in fn.arg_names
             if name.endswith("_ptr") or name.startswith("stride_")}
    return triton.compile(GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS})


# Tiles for many rows (prefill chunks): 64 weight rows by 128 activation rows a program (161 registers,
# 128 KB of shared memory for two groups of x16; 128 x 128 spills, 256 activation rows overflow shared
# memory). Unmeasured: bench/gpu_gguf_g16_tiles.py times them against the weight dequantized for cuBLAS.
TILE_BLOCK_N, TILE_BLOCK_M = 64, 128


def matmul_tiles(x: torch.Tensor, weight, block_n: int = TILE_BLOCK_N, block_m: int = TILE_BLOCK_M,
                 prefetch: bool = True) -> torch.Tensor:
    """x [M, K] (any M) @ weight.T for a Q4_K `RepackedMatrix` on a CUDA device: x prepared as mode "f16"
    takes it (`triton_gguf_f16.prepare_x`), then `_g16_kernel` over tiles of block_m activation rows and
    block_n weight rows, the whole K a program (no split), the result in x's dtype."""
    from onebit.kernels import triton_gguf_f16
    from onebit.kernels.triton_gguf_repacked import _operands

    if not available() or x.device.type != "cuda" or weight.qtype not in TYPES:
        raise ValueError(f'mode "g16" tiles take Q4_K on a CUDA device with Gluon, not {weight.qtype} on '
                         f'{x.device.type}')
    if x.shape[1] != weight.cols:
        raise ValueError(f"x has {x.shape[1]} columns, the weight {weight.cols}")
    x16, _, xe = triton_gguf_f16.prepare_x(x.contiguous())
    codes, _, scales, d = _operands(weight)
    out = torch.empty(x.shape[0], weight.rows, dtype=x.dtype, device=x.device)
    launch(x16, xe, codes, scales, d, out, weight.rows, weight.cols // 256, out.stride(0), 0,
           (triton.cdiv(weight.rows, block_n), 1), block_n, 0, prefetch, block_m)
    return out
