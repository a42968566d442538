"""Tile loads and stores shared by the few-row linear kernels (`triton_gemv`'s skinny product, `triton_fp8`).

Both walk K for a [BLOCK_M, BLOCK_N] output tile: load a tile of the activations' rows and one of the
weight's rows (out of range reads as zero), multiply, and at the end add the bias and store. What they
multiply differs (the FP8 kernel widens and scales its weight); these helpers hold what does not.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_row_tiles(x_ptr, w_ptr, rm, rn, k0, M, N, K, stride_xm, stride_wn, BLOCK_K: tl.constexpr):
    """x[rm, k0:k0 + BLOCK_K] and weight[rn, k0:k0 + BLOCK_K] (both with unit column stride), zero outside."""
    rk = k0 + tl.arange(0, BLOCK_K)
    k_ok = rk < K
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=(rm < M)[:, None] & k_ok[None, :], other=0.0)
    w = tl.load(w_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :],
                mask=(rn < N)[:, None] & k_ok[None, :], other=0.0)
    return x, w


@triton.jit
def store_with_bias(acc, b_ptr, y_ptr, rm, rn, M, N, stride_ym, HAS_BIAS: tl.constexpr):
    """y[rm, rn] = acc (+ bias[rn] when HAS_BIAS), added in fp32 and stored in y's dtype."""
    m_ok, n_ok = rm < M, rn < N
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])
