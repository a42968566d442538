"""Batch-invariant Triton product y = x @ W.T + b: a row's result does not depend on M or on the
row's position (`--deterministic`). Reference: `batch_invariant.matmul_ref`.

Every output element is one program's float32 accumulator, walked over K in BLOCK_K tiles in
order with `tl.dot` (tensor cores). What fixes an element's reduction order is the chain of
tensor-core instructions that update its accumulator (m64nNk16 wgmma on Hopper: one instruction
per 16 values of K, in K order) and where K is cut into splits. Rows of a tile are independent
inside an MMA, and BLOCK_N only says how many columns a program owns, so neither changes a sum;
BLOCK_M, BLOCK_K and the warp count could change which instruction the compiler emits, so a
launch table (`invariant_launch_table`) may only hold configs that a device sweep
(bench/gpu_invariant_sweep.py) found bit-identical to the reference config (BLOCK_M 64, BLOCK_K
64) on that device. Without a table: BLOCK_M 64 and BLOCK_K 64 for every M, and BLOCK_N, warps
and stages by M (`default_launch`).

Fixed split-K: a shape may cut K into `splits` chunks whose boundaries depend on K and the split
count alone (`chunk_len`), never on M. Each chunk is walked in order into its own float32
partial, and a second kernel adds the partials in split order (then the bias). For a given split
count every element is thus summed the same way for every M, and few-row products get
splits x more programs streaming the weight. The split count is per weight shape, the same for
every M (the table stores one per shape). Programs walk M fastest, so the M tiles of one weight
tile run together and share it through L2.

Variants (`Launch.variant`; the same K walk, so the same sums, wherever the sweep confirms it):
0 loads tiles through pointers with masks (a K mask only where K or the split is not a whole
number of BLOCK_K tiles); the others load them with Hopper's tensor memory accelerator (TMA,
host-built `TensorDescriptor`s that fill rows and columns past the tensor with zeros, as the
masks do): 1 one program per tile, 2 persistent (one program per SM walking tiles in order,
the tile loop flattened into the K loop so a tile's stores overlap the next tile's loads),
3 one program per tile with a warp-specialized K loop (producer warps issue the loads),
4 persistent and warp-specialized. A variant this Triton or device lacks fails to compile and
the sweep drops it; `matmul` runs a TMA launch through pointers (variant 0, same blocks) only
for a weight whose layout TMA cannot address, which the sweep's shapes never are.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from onebit.kernels import invariant_launch_table

try:  # host-side TMA descriptors (Triton 3.4+); without them only variant 0 runs
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the install
    TensorDescriptor = None

BLOCK_M = 64
BLOCK_K = 64
SPLIT_ALIGN = 256  # split boundaries are multiples of this (the largest BLOCK_K a table may hold)
WORKSPACE_BYTES = 128 << 20  # bound on the float32 partials of one split launch; more rows go in pieces
# Triton's CPU interpreter multiplies bf16 tiles as their raw 16-bit integers: there, the tiles
# are widened to float32 first (exact for bf16 and fp16), a path the GPU never takes.
DOT_FP32 = os.environ.get("TRITON_INTERPRET") == "1"


class Launch(NamedTuple):
    """One launch of the product kernel. Only block_n, warps and stages are free; block_m,
    block_k other than 64 and variant other than 0 are valid only where a device sweep showed
    they give the same bits."""

    block_n: int
    warps: int
    stages: int
    block_m: int = BLOCK_M
    block_k: int = BLOCK_K
    variant: int = 0  # 0 pointers; 1 TMA; 2 TMA persistent; 3 TMA warp-specialized; 4 both (module doc)


TMA_VARIANTS = {1: (False, False), 2: (True, False), 3: (False, True), 4: (True, True)}  # (persistent, ws)


# M is not specialized (Triton would compile M == 1 apart): one binary serves every row count.
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, K_CHUNK, stride_xm, stride_wn, stride_ym, stride_ys,
                   HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    k_lo = split * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:  # every tile lies inside [k_lo, k_hi): the K mask would be all true
            x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None], other=0.0)
            w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None], other=0.0)
        else:
            k_ok = rk < k_hi
            x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc)
    out = y_ptr + split.to(tl.int64) * stride_ys + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
    if SPLIT:  # a float32 partial; _sum_splits_kernel adds the bias
        tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _tma_tile(x_desc, w_desc, b_ptr, y_ptr, tile, M, N, K, K_CHUNK, stride_ym, stride_ys,
              HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, DOT_FP32: tl.constexpr):
    # tile -> (split, N tile, M tile), M fastest as in _matmul_kernel
    num_m = tl.cdiv(M, BLOCK_M)
    num_mn = num_m * tl.cdiv(N, BLOCK_N)
    split = tile // num_mn
    pid_n = (tile % num_mn) // num_m
    pid_m = tile % num_m
    k_lo = split * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # split boundaries are multiples of SPLIT_ALIGN, so a tile crosses only K's end, where TMA reads zeros
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        x = x_desc.load([pid_m * BLOCK_M, k0])
        w = w_desc.load([pid_n * BLOCK_N, k0])
        if DOT_FP32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    out = y_ptr + split.to(tl.int64) * stride_ys + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
    if SPLIT:
        tl.store(out, acc, mask=ok)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["M"])
def _matmul_tma_kernel(x_desc, w_desc, b_ptr, y_ptr, M, N, K, K_CHUNK, SPLITS, stride_ym, stride_ys,
                       HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, PERSISTENT: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr, DOT_FP32: tl.constexpr):
    if PERSISTENT:  # NUM_PROGRAMS programs, each walking tiles pid, pid + NUM_PROGRAMS, ...
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) * SPLITS
        for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS, flatten=True):
            _tma_tile(x_desc, w_desc, b_ptr, y_ptr, tile, M, N, K, K_CHUNK, stride_ym, stride_ys, HAS_BIAS, SPLIT,
                      BLOCK_M, BLOCK_N, BLOCK_K, WARP_SPECIALIZE, DOT_FP32)
    else:
        _tma_tile(x_desc, w_desc, b_ptr, y_ptr, tl.program_id(0), M, N, K, K_CHUNK, stride_ym, stride_ys, HAS_BIAS,
                  SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, WARP_SPECIALIZE, DOT_FP32)


@triton.jit
def _sum_splits_kernel(p_ptr, b_ptr, y_ptr, MN, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.load(p_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):  # split 0, then 1, 2, ...: the same order for every element
        acc += tl.load(p_ptr + s * MN + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


def chunk_len(k: int, splits: int) -> int:
    """K values per split: ceil(K / splits) rounded up to SPLIT_ALIGN, so that every split starts
    on a tile boundary of every BLOCK_K; depends on K and the split count only."""
    if splits <= 1:
        return k
    per_split = -(-k // splits)
    return SPLIT_ALIGN * -(-per_split // SPLIT_ALIGN)


def default_launch(m: int, n: int) -> Launch:
    """The launch without a table entry: BLOCK_M and BLOCK_K 64; BLOCK_N, warps and stages by M."""
    if m <= BLOCK_M:
        # One M tile: weight streaming. Narrow programs so that 4096-column layers still give
        # two programs per SM on a 132-SM GPU, with a deep pipeline to keep loads in flight.
        return Launch(16 if n <= 8192 else 32, 4, 5)
    if m <= 2 * BLOCK_M:
        return Launch(64, 4, 4)
    return Launch(128, 4, 3)


def launch_config(m: int, n: int, k: int | None = None, device: torch.device | None = None) -> Launch:
    """The launch for M rows of an [N, K] weight: the device's launch table entry when there is
    one (K and device given), else `default_launch`. None of them changes how an element is summed."""
    if k is not None and device is not None and device.type == "cuda":
        entry = invariant_launch_table.lookup(n, k, m, device)
        if entry is not None:
            return Launch(*entry[1])
    return default_launch(m, n)


def split_count(n: int, k: int, device: torch.device | None = None) -> int:
    """Splits of K for an [N, K] weight: the table's, the same for every M; 1 without one."""
    if device is not None and device.type == "cuda":
        entry = invariant_launch_table.lookup(n, k, 1, device)
        if entry is not None:
            return entry[0]
    return 1


def tma_addressable(t: torch.Tensor) -> bool:
    """True when a TMA descriptor can address the 2-D tensor t: unit column stride and 16-byte
    aligned start and rows."""
    return (TensorDescriptor is not None and t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and t.stride(0) * t.element_size() % 16 == 0)


@functools.lru_cache(maxsize=None)
def persistent_programs(device: torch.device) -> int:
    """Programs of a persistent launch: one per SM (4 in the CPU interpreter, so that a test's
    programs each walk several tiles)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _launch(x, weight, b, out, rows, n, k, chunk, used, stride_ys, launch, split, has_bias):
    """One launch of the product kernel of `launch.variant` over `rows` rows of x into out
    (bf16 [rows, N], or float32 partials [used, rows, N] when `split`)."""
    common = dict(HAS_BIAS=has_bias, SPLIT=split, BLOCK_M=launch.block_m, BLOCK_N=launch.block_n,
                  BLOCK_K=launch.block_k, DOT_FP32=DOT_FP32, num_warps=launch.warps, num_stages=launch.stages)
    tiles_mn = triton.cdiv(rows, launch.block_m) * triton.cdiv(n, launch.block_n)
    if launch.variant == 0:
        even_k = chunk % launch.block_k == 0 and k % launch.block_k == 0
        _matmul_kernel[(tiles_mn, used)](x, weight, b, out, rows, n, k, chunk, x.stride(0), weight.stride(0), n,
                                         stride_ys, EVEN_K=even_k, **common)
        return
    persistent, warp_specialize = TMA_VARIANTS[launch.variant]
    programs = persistent_programs(x.device)
    x_desc = TensorDescriptor(x, [rows, k], [x.stride(0), 1], [launch.block_m, launch.block_k])
    w_desc = TensorDescriptor(weight, [n, k], [weight.stride(0), 1], [launch.block_n, launch.block_k])
    grid = (min(tiles_mn * used, programs) if persistent else tiles_mn * used,)
    _matmul_tma_kernel[grid](x_desc, w_desc, b, out, rows, n, k, chunk, used, n, stride_ys, PERSISTENT=persistent,
                             NUM_PROGRAMS=programs, WARP_SPECIALIZE=warp_specialize, **common)


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: Launch | tuple[int, ...] | None = None, splits: int | None = None) -> torch.Tensor:
    """x [M, K] (unit column stride) @ weight [N, K].T (unit column stride) + bias, in x's dtype.
    `config` overrides `launch_config` (tests use it to show the result does not depend on it);
    `splits` overrides the shape's split count (which does change the bits, identically for every M)."""
    m, k = x.shape
    n = weight.shape[0]
    launch = Launch(*config) if config is not None else launch_config(m, n, k, x.device)
    splits = splits if splits is not None else split_count(n, k, x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    if launch.variant:
        if not tma_addressable(weight):  # fixed per weight, so the same for every M (module doc)
            launch = launch._replace(variant=0)
        elif not tma_addressable(x):  # a row view at an odd offset: a fresh copy is aligned
            x = x.clone(memory_format=torch.contiguous_format)
    chunk = chunk_len(k, splits)
    used = -(-k // chunk)  # splits that hold at least one K value
    b = bias if bias is not None else weight
    if used == 1:
        _launch(x, weight, b, y, m, n, k, k, 1, 0, launch, False, bias is not None)
        return y
    # Rows are independent, so cutting M into pieces bounds the partials without changing any row.
    step = max(launch.block_m, WORKSPACE_BYTES // (used * n * 4) // launch.block_m * launch.block_m)
    for r0 in range(0, m, step):
        rows = min(step, m - r0)
        partial = torch.empty((used, rows, n), dtype=torch.float32, device=x.device)
        _launch(x[r0:], weight, b, partial, rows, n, k, chunk, used, rows * n, launch, True, bias is not None)
        block = 1024
        _sum_splits_kernel[(triton.cdiv(rows * n, block),)](partial, b, y[r0:], rows * n, n, SPLITS=used,
                                                            HAS_BIAS=bias is not None, BLOCK=block)
    return y
