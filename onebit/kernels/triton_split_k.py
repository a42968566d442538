"""How split-K products finish: their float32 partials summed in a fixed order, by a kernel of its
own or by the last program of each output tile.

A split-K product (`triton_gemv.split_k_matmul`, `triton_fp8_fast.split_k`) runs SPLIT programs
per output tile, each over a slice of K, and writes an unscaled float32 partial per slice. Two ways
to turn them into the output:
- `_reduce_kernel`, a second launch that sums the SPLIT partials of every output in slice order,
  applies the column scale (per-channel FP8) and adds the bias;
- folded (`FOLD`): each program stores its partial and takes a ticket from a per-tile counter; the
  program that arrives last sums the tile's partials in the same slice order, scales, adds the
  bias and writes the output, then sets the counter back to zero for the next launch. One launch
  instead of two a product (at one row the reduce was 0.22 ms of a 3.3 ms FP8 step, plus its
  launch gaps; session 10), and the same bits as the reduce kernel: the same sums in the same order.
  The repacked GGUF kernels (`triton_gguf_repacked`) fold their split-K partials the same way.

The counters are one zeroed int32 buffer per device (`fold_counters`), shared by every folded
launch: products on a device run one at a time (the engine uses one stream, and graph capture
replays in the same order), and every launch leaves its counters at zero. The ticket is the
usual "arrive and the last one finishes" handshake: a CTA barrier so that all of the program's
partial stores come before one thread's acquire-release atomic at GPU scope, and the partials
read back through L2 (`.cg`), past any stale L1 line.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl

# Fold the partials' sum into the product's last program per tile. Off until a device run has
# checked it bit for bit against the reduce kernel over many graph replays and timed it
# (bench/gpu_split_fold.py); unmeasured prediction in docs/perf.md. ONEBIT_SPLIT_FOLD=1 turns it on
# in a process (the benches' child engines, a server) for A/B runs.
FOLD = os.environ.get("ONEBIT_SPLIT_FOLD", "0") == "1"
# Output tiles one launch may fold (its counters); a launch with more tiles takes the reduce kernel.
MAX_FOLD_TILES = 1 << 18
_COUNTERS: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _reduce_kernel(p_ptr, s_ptr, b_ptr, y_ptr, N, TOTAL, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr = False, HAS_SCALE: tl.constexpr = True):
    pdl.wait_for_previous(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < TOTAL
    acc = tl.load(p_ptr + offs, mask=ok, other=0.0)
    for part in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + part * TOTAL + offs, mask=ok, other=0.0)
    col = offs % N
    # HAS_SCALE: times a per-column scale (per-channel FP8 weights); block-scaled FP8 partials come
    # scaled and bf16 ones need none.
    if HAS_SCALE:
        acc = acc * tl.load(s_ptr + col, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + col, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def fold_partial(acc, part, tile, p_ptr, p_offs, TOTAL, y_ptr, y_offs, cols, ok, s_ptr, b_ptr, count_ptr, SPLIT,
                 HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Store this program's partial (slice `part` of SPLIT, TOTAL values a slice) at p_offs; the last
    of output tile `tile`'s SPLIT programs to arrive writes y[y_offs] = (the SPLIT partials summed in
    slice order) * scale[cols] + bias[cols], as `_reduce_kernel` computes it."""
    tl.store(p_ptr + part * TOTAL + p_offs, acc, mask=ok)
    tl.debug_barrier()  # every thread's partial stores before the ticket
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        total = tl.load(p_ptr + p_offs, mask=ok, other=0.0, cache_modifier=".cg")
        for other in range(1, SPLIT):
            total += tl.load(p_ptr + other * TOTAL + p_offs, mask=ok, other=0.0, cache_modifier=".cg")
        if HAS_SCALE:
            total = total * tl.load(s_ptr + cols, mask=ok, other=0.0)
        if HAS_BIAS:
            total += tl.load(b_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=ok)
        tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch


@triton.jit
def split_k_tile_and_part():
    """(tile, part) of a program of a split-K grid (row tiles, column tiles, K slices)."""
    return tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.program_id(2)


def fold_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's zeroed tile counters when a launch of `tiles` output tiles should fold its
    partials (FOLD on, few enough tiles), else None (the reduce kernel). The buffer is made on
    first use outside graph capture (calibration and warm-up run every product eagerly first)."""
    if not FOLD or tiles > MAX_FOLD_TILES:
        return None
    counters = _COUNTERS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # no allocation inside a capture; this launch takes the reduce kernel
        counters = _COUNTERS[device] = torch.zeros(MAX_FOLD_TILES, dtype=torch.int32, device=device)
    return counters


def fold_launch_args(y: torch.Tensor, tiles: int) -> dict:
    """The split-K kernels' keyword arguments that make a launch of `tiles` output tiles fold its
    partials into y (FOLD, y_ptr, stride_ym, count_ptr), or {} when it should not (`fold_counters`)."""
    counters = fold_counters(y.device, tiles)
    if counters is None:
        return {}
    return {"FOLD": True, "y_ptr": y, "stride_ym": y.stride(0), "count_ptr": counters}


def reduce_partials(partial: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
                    y: torch.Tensor) -> None:
    """y [M, N] (contiguous) = sum over slices of partial [SPLIT, M, N] in slice order, times scale [N]
    when given, plus bias [N] when given: the second launch of an unfolded split-K product."""
    split, m, n = partial.shape
    b_arg = bias if bias is not None else partial
    block = 1024
    _reduce_kernel[(triton.cdiv(m * n, block),)](partial, scale if scale is not None else partial, b_arg, y, n, m * n,
                                                 HAS_BIAS=bias is not None, SPLIT=split, BLOCK=block, num_warps=4,
                                                 HAS_SCALE=scale is not None, **pdl.options())
