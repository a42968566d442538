"""A Triton matrix-vector product for one-row linear layers (decoding a single sequence).

At one row a linear layer is pure weight streaming: y[n] = sum_k W[n, k] x[k] reads every
weight once and does two FLOPs per weight. Each program owns BLOCK_N output rows and walks K
in BLOCK_K tiles, accumulating in fp32. Whether it beats cuBLAS for a given shape is measured
on the device (`onebit.kernels.gemv.calibrate`), never assumed. Reference: `F.linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_N, BLOCK_K, num_warps) tried per shape by the calibration.
CONFIGS = [(4, 1024, 4), (8, 512, 4), (8, 1024, 4), (16, 512, 4), (16, 256, 4), (32, 256, 8)]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_wn,
                 HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
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


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple[int, int, int]):
    """F.linear(x, weight, bias) for x [1, K] and a row-major weight [N, K], with one config."""
    block_n, block_k, warps = config
    n, k = weight.shape
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, bias if bias is not None else weight, y, n, k,
                                              weight.stride(0), HAS_BIAS=bias is not None,
                                              BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    return y
