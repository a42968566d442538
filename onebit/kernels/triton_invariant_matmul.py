"""Batch-invariant Triton product y = x @ W.T + b: a row's result does not depend on M or on the
row's position (`--deterministic`). Reference: `batch_invariant.matmul_ref`.

Every output element is one program's float32 accumulator, walked over K in BLOCK_K tiles from
0 to K in order with `tl.dot` (tensor cores), with no split-K. BLOCK_K and BLOCK_M are the same
for every M, so each element is reduced by the same sequence of tensor-core instructions
(m64 wgmma on Hopper) whatever the batch; rows of a tile are independent inside an MMA. Only
BLOCK_N (how many output columns a program owns, which never changes a column's sum), the warp
count and the pipeline depth follow M: few rows need narrow programs so that enough of them
stream the weights (M <= 16 reads each weight once, like a skinny GEMV kernel), many rows need
wide ones so that x is not re-read too often. Programs walk M fastest, so the M tiles of one
weight tile run together and share it through L2.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_K = 64
# Triton's CPU interpreter multiplies bf16 tiles as their raw 16-bit integers: there, the tiles
# are widened to float32 first (exact for bf16 and fp16), a path the GPU never takes.
DOT_FP32 = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def launch_config(m: int, n: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) for M rows and N columns; none of them changes the order
    in which an output element is summed."""
    if m <= BLOCK_M:
        # One M tile: weight streaming. Narrow programs so that 4096-column layers still give
        # two programs per SM on a 132-SM GPU, with a deep pipeline to keep loads in flight.
        return (16 if n <= 8192 else 32), 4, 5
    if m <= 2 * BLOCK_M:
        return 64, 4, 4
    return 128, 4, 3


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] (unit column stride) @ weight [N, K].T (unit column stride) + bias, in x's dtype.
    `config` overrides `launch_config` (tests use it to show the result does not depend on it)."""
    m, k = x.shape
    n = weight.shape[0]
    block_n, warps, stages = config or launch_config(m, n)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, block_n),)
    _matmul_kernel[grid](x, weight, bias if bias is not None else weight, y, m, n, k,
                         x.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None,
                         BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=BLOCK_K, DOT_FP32=DOT_FP32,
                         num_warps=warps, num_stages=stages)
    return y
