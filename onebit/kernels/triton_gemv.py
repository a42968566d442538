"""Triton products for linear layers with few rows (decoding one to a few sequences).

At a handful of rows a linear layer is pure weight streaming: it reads every weight once and
does 2 x rows FLOPs per weight. Two kernels, each program owning BLOCK_N output columns and
walking K in BLOCK_K tiles with fp32 accumulation:
- `gemv`, one row: an elementwise product and a row sum (no tensor cores needed);
- `skinny_matmul`, up to 16 rows: the rows padded to 16 and multiplied with `tl.dot`.
Whether either beats cuBLAS for a given shape and row count is measured on the device
(`onebit.kernels.gemv.calibrate`), never assumed. Reference: `F.linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl

MAX_ROWS = 16  # skinny_matmul pads the rows to this (tl.dot's smallest tile)
# (BLOCK_N, BLOCK_K, num_warps) tried per shape by the calibration.
GEMV_CONFIGS = [(4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 512, 4), (16, 256, 4), (32, 256, 8)]
SKINNY_CONFIGS = [(16, 256, 4), (16, 512, 4), (32, 128, 4), (32, 256, 4), (64, 128, 4)]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=row_ok)


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


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple[int, int, int]):
    """F.linear(x, weight, bias) for x [1, K] (contiguous) and a weight [N, K] with unit column stride."""
    block_n, block_k, warps = config
    n, k = weight.shape
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, bias if bias is not None else weight, y, n, k,
                                              weight.stride(0), HAS_BIAS=bias is not None,
                                              BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **pdl.options())
    return y


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


KERNELS = {"gemv": gemv, "skinny": skinny_matmul}


def candidates(rows: int) -> list[tuple[str, tuple[int, int, int]]]:
    """(kernel name, config) pairs that can run a product with this many rows."""
    out = [("gemv", c) for c in GEMV_CONFIGS] if rows == 1 else []
    return out + ([("skinny", c) for c in SKINNY_CONFIGS] if rows <= MAX_ROWS else [])
