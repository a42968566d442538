"""FP8 (e4m3) weights: per-output-channel quantization and the products that read them.

A weight [N, K] is stored as e4m3 values with one float32 scale per output row, so
`weight ~= q * scale[:, None]`. Two ways to multiply by it, chosen by the number of rows:
- up to 64 rows (decoding): weight-only. A Triton kernel (`triton_fp8`) loads the e4m3 weight
  (half the bytes of bf16), widens it in registers and multiplies with the activations as they
  are; the scale is applied to each output column at the end.
- more rows (prefill, large batches): both operands in FP8 on the tensor cores. The activations
  are quantized per token on the fly (one scale per row, as vLLM's dynamic per-token scheme)
  and `torch._scaled_mm` multiplies with row-wise scales.
On the CPU (and wherever neither applies) the plain-torch references below run; tests compare
the kernels against them.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# Measured on the H200 (docs/perf-history.md, FP8): at 64 rows the weight-only kernel beat
# `_scaled_mm` with per-token quantization on the attention products (25.6 vs 36.2 us, 18.7 vs 35.9)
# and tied on the MLP's down product; at 128 rows it lost everywhere. Both are slower than bf16
# cuBLAS above 16 rows.
MAX_WEIGHT_ONLY_ROWS = 64

try:
    from onebit.kernels import triton_fp8
except ImportError:  # pragma: no cover - depends on the install
    triton_fp8 = None


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q [R, K] in e4m3 and scale [R] float32 such that t ~= q * scale[:, None]."""
    amax = t.abs().amax(dim=-1).float().clamp_min(1e-12)
    scale = amax / FP8_MAX
    q = (t.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q * scale[:, None] in `dtype`."""
    return (q.float() * scale[:, None]).to(dtype)


def weight_only_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the few-row product: x @ (q * scale).T + bias, accumulated in float32."""
    y = (x.float() @ q.float().t()) * scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the many-row product: x quantized per token to e4m3, then the scaled product."""
    xq, xs = quantize_rows(x)
    y = (xq.float() @ q.float().t()) * xs[:, None] * scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _scaled_mm(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The many-row product on FP8 tensor cores (row-wise scales give a bf16 result)."""
    xq, xs = quantize_rows(x)
    y = torch._scaled_mm(xq, q.t(), scale_a=xs[:, None], scale_b=scale[None, :].contiguous(),
                         bias=bias.to(torch.bfloat16) if bias is not None else None,
                         out_dtype=torch.bfloat16, use_fast_accum=True)
    return y.to(x.dtype)


def dequantize_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A block-scaled weight as values: q [N, K] times scale_inv [ceil(N/bn), ceil(K/bk)] of its block."""
    bn, bk = block
    n, k = q.shape
    if n % bn == 0 and k % bk == 0:  # whole blocks: broadcast the scales, no per-element copy
        blocks = q.view(n // bn, bn, k // bk, bk).float() * scale_inv.float()[:, None, :, None]
        return blocks.view(n, k).to(dtype)
    per_element = scale_inv.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (q.float() * per_element).to(dtype)


def block_weight_only_ref(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                          bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the block-scaled product: x @ dequantize_blocks(q, scale_inv).T + bias, in float32."""
    y = x.float() @ dequantize_blocks(q, scale_inv, block).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def linear_blocks(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] times a block-scaled FP8 weight (as published FP8 checkpoints store it) plus bias.

    On CUDA up to MAX_WEIGHT_ONLY_ROWS rows: the Triton weight-only kernel applying each
    (block row, block column) scale to its partial product (exact: no requantization). More rows:
    the weight dequantized to x's dtype for one cuBLAS product (a transient copy of one matrix).
    Elsewhere the reference."""
    if x.is_cuda and x.dim() == 2:
        if x.shape[0] <= MAX_WEIGHT_ONLY_ROWS and triton_fp8 is not None:
            return triton_fp8.weight_only(x.contiguous(), q, scale_inv, bias, block=block)
        weight = dequantize_blocks(q, scale_inv, block, x.dtype)
        return torch.nn.functional.linear(x, weight, bias.to(x.dtype) if bias is not None else None)
    return block_weight_only_ref(x, q, scale_inv, block, bias)


def linear(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] times an FP8 weight (q [N, K], scale [N]) plus bias: the kernels on CUDA, else the
    weight-only reference."""
    if x.is_cuda and x.dim() == 2:
        if x.shape[0] <= MAX_WEIGHT_ONLY_ROWS and triton_fp8 is not None:
            return triton_fp8.weight_only(x.contiguous(), q, scale, bias)
        if x.shape[1] % 16 == 0 and q.shape[0] % 16 == 0:
            return _scaled_mm(x.contiguous(), q, scale, bias)
    return weight_only_ref(x, q, scale, bias)
