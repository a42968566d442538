"""Triton product of a few rows with an FP8 (e4m3) weight and one scale per output column.

Decoding reads every weight once per step, so the bytes read set the time: e4m3 halves them
against bf16. Each program owns BLOCK_M rows and BLOCK_N output columns, walks K in BLOCK_K
tiles, widens the weight tile to the activations' dtype in registers, multiplies on the tensor
cores (`tl.dot`, rows padded to BLOCK_M) with fp32 accumulation, and scales its columns once at
the end. Up to 16 rows one row tile covers them; up to MAX_ROWS, tiles of 64 rows (each program
then reads its weight tile once per row tile, still far fewer bytes than the activations' worth).
Reference: `onebit.kernels.fp8.weight_only_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels.triton_gemv import load_k_tiles, store_rows

MAX_ROWS = 128
# (BLOCK_N, BLOCK_K, num_warps): the default, and the candidates bench/gpu_fp8.py times. On the
# H200 (32, 256, 4) and (32, 512, 4) were best at 1-16 rows, (32, 128, 4) at 64 and 128 rows
# (1.5-2x faster than (32, 256, 4) there).
DEFAULT_CONFIG = (32, 256, 4)
MANY_ROWS_CONFIG = (32, 128, 4)
CONFIGS = [(16, 256, 4), (16, 512, 4), (32, 128, 4), (32, 256, 4), (32, 512, 4), (64, 128, 4), (64, 256, 8)]


@triton.jit
def _weight_only_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, stride_sn,
                        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr):
    # SCALE_BN == 0: one scale per output column. Else the scale of weight (n, k) is
    # s[n // SCALE_BN, k // SCALE_BK] (block-scaled checkpoints); BLOCK_K divides SCALE_BK, so a K
    # tile lies in one block column and its partial product takes one scale per output column.
    pid = tl.program_id(0)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x, w = load_k_tiles(x_ptr, w_ptr, rm, rn, m_ok, n_ok, k0, K, stride_xm, stride_wn, BLOCK_K)
        if SCALE_BN == 0:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
        else:
            s = tl.load(s_ptr + (rn // SCALE_BN) * stride_sn + k0 // SCALE_BK, mask=n_ok, other=0.0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype))) * s[None, :]
    if SCALE_BN == 0:
        acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
    store_rows(acc, b_ptr, y_ptr, rm, rn, m_ok, n_ok, stride_ym, HAS_BIAS)


def weight_only(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                config: tuple[int, int, int] | None = None, block: tuple[int, int] | None = None) -> torch.Tensor:
    """x [M <= MAX_ROWS, K] (unit column stride) @ (q [N, K] e4m3 * scale [N]).T + bias, in x's dtype.

    With `block` (bn, bk), scale is [ceil(N/bn), ceil(K/bk)] float32, one per weight block (the
    K tile shrinks to divide bk)."""
    m, n, k = x.shape[0], q.shape[0], q.shape[1]
    block_n, block_k, warps = config or (DEFAULT_CONFIG if m <= 16 else MANY_ROWS_CONFIG)
    if m > MAX_ROWS:
        raise ValueError(f"weight_only takes at most {MAX_ROWS} rows, got {m}")
    scale_bn, scale_bk = block or (0, 0)
    if block is not None:
        block_k = min(block_k, scale_bk)
        if scale_bk % block_k or block_k & (block_k - 1):
            raise ValueError(f"weight block {block} needs a power-of-two K tile dividing {scale_bk}")
    block_m = 16 if m <= 16 else 64
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _weight_only_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        x, q, scale, bias if bias is not None else scale, y, m, n, k, x.stride(0), q.stride(0), y.stride(0),
        scale.stride(0) if block is not None else 0,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SCALE_BN=scale_bn, SCALE_BK=scale_bk, num_warps=warps)
    return y
