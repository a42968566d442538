"""How split-K products finish: their float32 partials summed in a fixed order by a kernel of its own.

A split-K product (`triton_gemv.split_k_matmul`, `triton_fp8_fast.split_k`, the GGUF few-row
kernels of `triton_gguf` and `triton_gguf_repacked`) runs SPLIT programs
per output tile, each over a slice of K, and writes an unscaled float32 partial per slice;
`_reduce_kernel`, a second launch, sums the SPLIT partials of every output in slice order
(deterministic), applies the column scale (per-channel FP8) and adds the bias.

Tried and removed (session 14, docs/perf-history.md "G31"): folding that sum into each tile's last
program (a per-tile ticket counter, the partials read back through L2). Bit for bit the same, but
slower on the H200 (fp8 engine B=1 340 against 355 tok/s): the last program's serial read of the
SPLIT partials costs more than the second launch it saves. And (session 19, "Split-K sums left to
their readers"): handing the partials to the kernel that reads the product (add + RMSNorm, SiLU * mul),
which summed them as it loaded them. Bit for bit the same again, and slower again (Q4_K_M B=1 310
against 297 tok/s, FP8 B=64 15,280 against 14,827): at one row that reader is one program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl


@triton.jit
def _reduce_kernel(p_ptr, s_ptr, b_ptr, y_ptr, N, TOTAL, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr = False, HAS_SCALE: tl.constexpr = True, stride_ym=0):
    pdl.wait_for_previous(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    acc = tl.load(p_ptr + offs, mask=ok, other=0.0)
    for part in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + part * TOTAL + offs, mask=ok, other=0.0)
    row = offs // N
    col = offs - row * N
    # HAS_SCALE: times a per-column scale (per-channel FP8 weights); block-scaled FP8 partials come
    # scaled and bf16 ones need none.
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + col, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_ym + col, acc.to(y_ptr.dtype.element_ty), mask=ok)


def reduce_block(total: int) -> int:
    """Outputs a program of `_reduce_kernel` sums: about 256 programs' worth, between 128 and 1024. At
    one activation row (4,096-24,576 outputs) a fixed 1,024 left 4-24 programs, each reading its
    SPLIT partials alone: 5-7 us under ncu (session 18) for a sum of 256 KB."""
    return max(128, min(1024, triton.next_power_of_2(triton.cdiv(total, 256))))


def reduce_partials(partial: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
                    y: torch.Tensor) -> None:
    """y [M, N] (unit column stride; a column slice of a wider output is fine) = sum over slices of
    partial [SPLIT, M, N] (contiguous) in slice order, times scale [N] when given, plus bias [N] when
    given: the second launch of a split-K product."""
    split, m, n = partial.shape
    b_arg = bias if bias is not None else partial
    block = reduce_block(m * n)
    _reduce_kernel[(triton.cdiv(m * n, block),)](partial, scale if scale is not None else partial, b_arg, y, n, m * n,
                                                 HAS_BIAS=bias is not None, SPLIT=split, BLOCK=block, num_warps=4,
                                                 HAS_SCALE=scale is not None, stride_ym=y.stride(0), **pdl.options())
