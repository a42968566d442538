"""Triton products for linear layers with few rows (decoding steps: 1 to 128 rows).

At a handful of rows a linear layer is pure weight streaming: it reads every weight once and
does 2 x rows FLOPs per weight. Three kernels, each program owning BLOCK_N output columns and
walking K in BLOCK_K tiles with fp32 accumulation:
- `gemv`, one row: an elementwise product and a row sum (no tensor cores needed);
- `skinny_matmul`, up to 16 rows: the rows padded to 16 and multiplied with `tl.dot`;
- `split_k_matmul`, up to 128 rows: row tiles through `tl.dot` and K split over several programs
  per output tile, their float32 partials summed in a fixed order by a second kernel
  (`triton_split_k`, which the FP8 split-K product shares).
Whether any beats cuBLAS for a given shape and row count is measured on the device
(`onebit.kernels.gemv.calibrate`), never assumed. Reference: `F.linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.triton_activations import silu_times
from onebit.kernels.triton_split_k import reduce_partials

MAX_ROWS = 16  # skinny_matmul pads the rows to this (tl.dot's smallest tile)
# (BLOCK_N, BLOCK_K, num_warps) tried per shape by the calibration.
# The last four, in the shape of FP8's narrow one-row winners (session 27: 4-8 columns a program, long K
# tiles), took qkv, o and down from cuBLAS and split-K at the 8B shape: bf16 B=1 227.1 -> 233.4 (session 28).
GEMV_CONFIGS = [(4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 512, 4), (16, 256, 4), (32, 256, 8),
                (4, 2048, 4), (8, 2048, 8), (8, 1024, 8), (4, 4096, 8)]
SKINNY_CONFIGS = [(16, 256, 4), (16, 512, 4), (32, 128, 4), (32, 256, 4), (64, 128, 4)]
# `split_k_matmul` (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, num_warps). At 64 rows cuBLAS reads the
# 4096-wide products at 2.8-3.2 TB/s (o and qkv in one wave of 128 and 96 tiles; G23, session 12)
# against 4.0 for gate_up; splitting K gives more programs, each streaming its slice.
# Above 16 rows, tiles of 64 or 128 rows: sm_90's bf16 wgmma takes 64 rows a warp group (a smaller
# tile compiles to the older mma instruction). Unmeasured: calibration times them against cuBLAS.
MAX_SPLIT_K_ROWS = 128
FEW_ROW_SPLIT_K_CONFIGS = [(16, 32, 256, 2, 4), (16, 64, 128, 4, 4), (16, 32, 128, 4, 4)]
MANY_ROW_SPLIT_K_CONFIGS = [(64, 64, 64, 2, 4), (64, 64, 128, 2, 4), (64, 128, 64, 2, 4), (64, 64, 128, 4, 4),
                            (64, 32, 128, 4, 4), (64, 128, 128, 1, 8), (128, 64, 64, 1, 8)]


@triton.jit
def _gemv_weights(w_ptr, rows, row_ok, k0, K, stride_wn, BLOCK_K: tl.constexpr):
    # the weight rows' K tile at k0 [BLOCK_N, BLOCK_K], zeros outside the matrix
    cols = k0 + tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :],
                   mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)


@triton.jit
def _gemv_weight_tiles(w_ptr, rows, row_ok, N, k0, K, stride_wn, BLOCK_K: tl.constexpr, GATED: tl.constexpr):
    # The K tile at k0 of the weight rows and, GATED, of the up rows N + rows below them (else the first
    # again, not loaded twice)
    w = _gemv_weights(w_ptr, rows, row_ok, k0, K, stride_wn, BLOCK_K)
    if GATED:
        w_up = _gemv_weights(w_ptr, rows + N, row_ok, k0, K, stride_wn, BLOCK_K)
    else:
        w_up = w
    return w, w_up


@triton.jit
def _gemv_add(acc, acc_up, ss, w, w_up, x_ptr, k0, K, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
              NORM: tl.constexpr):
    # acc (and, GATED, acc_up) plus the rows' [BLOCK_N] sums over the K tile at k0 of x times w (w_up);
    # NORM: ss plus the tile's sum of x squared (the program reads all of x, so it has the whole row's)
    cols = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if GATED:
        acc_up += tl.sum(w_up.to(tl.float32) * x[None, :], axis=1)
    if NORM:
        ss += tl.sum(x * x, axis=0)
    return acc, acc_up, ss


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
                 EARLY: tl.constexpr = False, GATED: tl.constexpr = False, NORM: tl.constexpr = False, eps=0.0,
                 RESIDUAL: tl.constexpr = False, r_ptr=None):
    # EARLY (`pdl.early_weights`): the first weight tile is loaded before the wait for the previous kernel.
    # GATED: the weight is an MLP's [gate | up] (2N rows, N the output's width); each program sums gate rows
    # and the up rows N + rows over the same x loads and stores silu(gate) * up (`silu_times` of the two
    # rounded to y's dtype: the bits of the product followed by `triton_fused.silu_mul`).
    # NORM (a weight with the RMSNorm's weight folded into its columns, `gemv.fold_norm_into`): the products of the
    # raw row x, times 1 / rms(x) (eps inside) before the bias: the product of the normed row, without a
    # norm kernel. RESIDUAL: y = product (rounded to y's dtype) + r_ptr's row, the add + norm kernel's sum.
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    ss = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)  # a float32 scalar zero: the row's sum of squares
    loop_begin = 0
    if EARLY:
        w_first, w_up_first = _gemv_weight_tiles(w_ptr, rows, row_ok, N, 0, K, stride_wn, BLOCK_K, GATED)
        pdl.wait_for_previous(PDL)
        acc, acc_up, ss = _gemv_add(acc, acc_up, ss, w_first, w_up_first, x_ptr, 0, K, BLOCK_K, GATED, NORM)
        loop_begin = BLOCK_K
    else:
        pdl.wait_for_previous(PDL)
    for k0 in range(loop_begin, K, BLOCK_K):
        w, w_up = _gemv_weight_tiles(w_ptr, rows, row_ok, N, k0, K, stride_wn, BLOCK_K, GATED)
        acc, acc_up, ss = _gemv_add(acc, acc_up, ss, w, w_up, x_ptr, k0, K, BLOCK_K, GATED, NORM)
    if NORM:
        rstd = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * rstd
        acc_up = acc_up * rstd
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        if GATED:
            acc_up += tl.load(b_ptr + N + rows, mask=row_ok, other=0.0).to(tl.float32)
    out_type = y_ptr.dtype.element_ty
    if GATED:
        tl.store(y_ptr + rows, silu_times(acc.to(out_type), acc_up.to(out_type)), mask=row_ok)
    elif RESIDUAL:
        tl.store(y_ptr + rows, acc.to(out_type) + tl.load(r_ptr + rows, mask=row_ok, other=0.0), mask=row_ok)
    else:
        tl.store(y_ptr + rows, acc.to(out_type), mask=row_ok)


@triton.jit
def load_k_tiles(x_ptr, w_ptr, rm, rn, m_ok, n_ok, k0, K, stride_xm, stride_wn, BLOCK_K: tl.constexpr):
    """Columns k0.. (BLOCK_K of them) of activation rows rm [BM, BK] and of weight rows rn [BN, BK],
    zeros outside the matrices (both with unit column stride)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    k_ok = rk < K
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :],
                mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    return x, w


@triton.jit
def store_rows(acc, b_ptr, y_ptr, rm, rn, m_ok, n_ok, stride_ym, HAS_BIAS: tl.constexpr):
    """y[rm, rn] = the float32 tile acc [BM, BN] (+ bias[rn] with HAS_BIAS), in y's dtype."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x, w = load_k_tiles(x_ptr, w_ptr, rm, rn, m_ok, n_ok, k0, K, stride_xm, stride_wn, BLOCK_K)
        acc = tl.dot(x, tl.trans(w), acc)
    store_rows(acc, b_ptr, y_ptr, rm, rn, m_ok, n_ok, stride_ym, HAS_BIAS)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple[int, int, int],
         norm_eps: float | None = None, residual: torch.Tensor | None = None):
    """F.linear(x, weight, bias) for x [1, K] (contiguous) and a weight [N, K] with unit column stride.
    norm_eps: the product of x / rms(x) (eps inside the root) instead of x, for a weight with its
    RMSNorm's weight folded in (`gemv.fold_norm_into`). residual [1, N] (contiguous, x's dtype): returns the
    product rounded to x's dtype plus residual (what add + RMSNorm would sum)."""
    if residual is not None and (residual.shape != (1, weight.shape[0]) or not residual.is_contiguous()):
        raise ValueError(f"residual {tuple(residual.shape)} does not fit a [1, {weight.shape[0]}] output")
    return _launch_gemv(x, weight, bias, config, gated=False, norm_eps=norm_eps, residual=residual)


def _launch_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple[int, int, int],
                 gated: bool, norm_eps: float | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    # `_gemv_kernel` over the weight's rows, or with `gated` over its gate half (SiLU * mul of the halves)
    block_n, block_k, warps = config
    n, k = weight.shape[0] // (2 if gated else 1), weight.shape[1]
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    extra = {} if norm_eps is None else {"NORM": True, "eps": norm_eps}
    if residual is not None:
        extra |= {"RESIDUAL": True, "r_ptr": residual}
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, bias if bias is not None else weight, y, n, k,
                                              weight.stride(0), HAS_BIAS=bias is not None,
                                              BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **pdl.options(),
                                              EARLY=pdl.early_weights(), GATED=gated, **extra)
    return y


def gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple[int, int, int],
                  norm_eps: float | None = None):
    """silu(gate) * up for x [1, K] (contiguous) and an MLP's [gate | up] weight [2 I, K] (unit column stride,
    bias [2 I] or None) in one launch: bit for bit `gemv` with this config followed by
    `triton_fused.silu_mul`; returns [1, I] in x's dtype. norm_eps as `gemv`'s."""
    if x.shape[0] != 1 or weight.shape[0] % 2:
        raise ValueError(f"gemv_silu_mul takes one row and an even number of weight rows; got {x.shape[0]} "
                         f"row(s), weight {tuple(weight.shape)}")
    return _launch_gemv(x, weight, bias, config, gated=True, norm_eps=norm_eps)


def skinny_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  config: tuple[int, int, int]):
    """F.linear(x, weight, bias) for x [M <= 16, K] (unit column stride) and a weight [N, K] with
    unit column stride."""
    block_n, block_k, warps = config
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if m > MAX_ROWS:
        raise ValueError(f"skinny_matmul takes at most {MAX_ROWS} rows, got {m}")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, block_n),)](x, weight, bias if bias is not None else weight, y, m, n, k,
                                                x.stride(0), weight.stride(0), y.stride(0),
                                                HAS_BIAS=bias is not None, BLOCK_M=MAX_ROWS, BLOCK_N=block_n,
                                                BLOCK_K=block_k, num_warps=warps, **pdl.options())
    return y


@triton.jit
def _split_k_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, K_PER_SPLIT, stride_xm, stride_wn, stride_om,
                    stride_split, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    # SPLIT > 1: out_ptr is the [SPLIT, M, N] float32 partials (`triton_split_k.reduce_partials` sums them).
    # Row tiles vary fastest: programs sharing a weight tile run together, so it is read from HBM once.
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    # Columns past N read row 0 instead of masking (those columns are never stored).
    w_rows = w_ptr + tl.where(n_ok, rn, 0).to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + rm[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin = pid_k * K_PER_SPLIT
    for k0 in range(k_begin, k_begin + K_PER_SPLIT, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + rk[None, :], mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
        acc = tl.dot(x, tl.trans(w), acc)
    if SPLIT == 1:
        store_rows(acc, b_ptr, out_ptr, rm, rn, m_ok, n_ok, stride_om, HAS_BIAS)
    else:
        tl.store(out_ptr + pid_k * stride_split + rm[:, None] * stride_om + rn[None, :], acc,
                 mask=m_ok[:, None] & n_ok[None, :])


def split_k_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   config: tuple[int, int, int, int, int]) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [M <= MAX_SPLIT_K_ROWS, K] (unit column stride) and a weight
    [N, K] with unit column stride, K split over SPLIT programs per output tile (float32 partials
    summed in a fixed order, `triton_split_k`). config: (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, warps)."""
    block_m, block_n, block_k, split, warps = config
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if m > MAX_SPLIT_K_ROWS:
        raise ValueError(f"split_k_matmul takes at most {MAX_SPLIT_K_ROWS} rows, got {m}")
    # Each slice a whole number of BLOCK_K tiles; the last slices may run past K (masked) or be empty.
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    b_arg = bias if bias is not None else weight
    shape = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=warps)
    if split == 1:
        _split_k_kernel[grid](x, weight, b_arg, y, m, n, k, k_per_split, x.stride(0), weight.stride(0), y.stride(0),
                              0, HAS_BIAS=bias is not None, **shape, **pdl.options())
        return y
    partial = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _split_k_kernel[grid](x, weight, b_arg, partial, m, n, k, k_per_split, x.stride(0), weight.stride(0), n, m * n,
                          HAS_BIAS=False, **shape, **pdl.options())
    reduce_partials(partial, None, bias, y)
    return y


KERNELS = {"gemv": gemv, "skinny": skinny_matmul, "split_k": split_k_matmul}


def candidates(rows: int) -> list[tuple[str, tuple]]:
    """(kernel name, config) pairs that can run a product with this many rows."""
    out = [("gemv", c) for c in GEMV_CONFIGS] if rows == 1 else []
    if rows <= MAX_ROWS:  # split-K at 1 row too: the skinny kernel's 16-row tile won some products there (G23)
        out += [("skinny", c) for c in SKINNY_CONFIGS] + [("split_k", c) for c in FEW_ROW_SPLIT_K_CONFIGS]
    elif rows <= MAX_SPLIT_K_ROWS:
        out += [("split_k", c) for c in MANY_ROW_SPLIT_K_CONFIGS if c[0] == 64 or rows > 64]
    return out
