"""Triton kernels that emit a product's FP8 input directly: add + RMSNorm ending in the per-token
e4m3 quantization `_scaled_mm` wants (one scale per row), and SiLU * mul ending in a quantization per
row and block of K values (the w8a8 split-K kernel's "blocks" form, `fp8.FED_KINDS`).

With FP8 weights, a product of many rows runs on e4m3 activations. Its input used to be written in
bf16 by the norm (or SiLU * mul) kernel, then read again by a separate quantizer
(`triton_fp8_fast.quantize_rows`): two launches and a round trip of the activations. Here the
producing kernel rounds its result to the model's dtype exactly as the unfused kernel stores it,
takes the absolute maximum of the values one scale covers and writes e4m3 values and the scale
instead, so the numbers are the ones the separate quantizer would have produced from the stored
result (the scale and rounding of `triton_fp8_fast._e4m3_scale` and `_to_e4m3`: IEEE division, exact
e4m3). Both wait for the previous kernel under PDL, as the kernels around them do.

The norm runs one program a row, its row in one block (`triton_fused._add_rms_norm_kernel`). SiLU *
mul runs one program a row and block of K, as the unfused `triton_fused.silu_mul` does (rows x I /
1024 programs). Its first fused form, one scale a row, ran one program a row (64 at 64 rows,
walking a 12,288-value row): sessions 9 and 14 timed it at 0.74-0.99x the unfused pair, and the
model fused only the norms (`models.quantize.FUSED_PRODUCERS`). The per-block form keeps the
unfused kernel's parallelism: with it, down at 64 rows took 18.3 us against 20.9 quantizing its own
input (session 26, H200), and the model fuses both.
References: `onebit.kernels.fp8.add_rms_norm_quantize_ref` and `fp8.silu_mul_quantize_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl, triton_fp8_fast
from onebit.kernels.triton_fp8_fast import _e4m3_scale, _to_e4m3
from onebit.kernels.triton_fused import _add_rms_norm_row, _norm_weight_then_wait, _silu_mul_row


@triton.jit
def _add_rms_norm_quantize_kernel(x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, n_cols, eps,
                                  HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                                  EARLY: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    w = _norm_weight_then_wait(w_ptr, cols, ok, PDL, EARLY)
    # The value the unfused kernel stores (rounded to x's dtype), then quantized as a row.
    out = _add_rms_norm_row(x_ptr, res_ptr, w, res_out_ptr, row, cols, ok, n_cols, eps, HAS_RESIDUAL)
    out = out.to(tl.float32)
    scale = _e4m3_scale(tl.max(tl.abs(out), axis=0))
    tl.store(s_ptr + row, scale)
    tl.store(q_ptr + row * n_cols + cols, _to_e4m3(out, scale).to(q_ptr.dtype.element_ty), mask=ok)


def add_rms_norm_quantize(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(q [T, D] e4m3, scale [T, 1] float32, x + residual or None) with q * scale ~= rms_norm(x + residual)
    as `triton_fused.add_rms_norm` would store it, for a contiguous [T, D] x."""
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else x
    block = triton.next_power_of_2(cols)
    _add_rms_norm_quantize_kernel[(rows,)](x, residual if residual is not None else x, weight, q, scale, res_out,
                                           cols, eps, HAS_RESIDUAL=residual is not None, BLOCK=block,
                                           num_warps=triton_fp8_fast.row_warps(block, rows), EARLY=pdl.early_weights(),
                                           **pdl.options())
    return q, scale, (res_out if residual is not None else None)


@triton.jit
def _silu_mul_quantize_kernel(gu_ptr, q_ptr, s_ptr, n_cols, n_blocks, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row, block = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    v = _silu_mul_row(gu_ptr + row * 2 * n_cols, cols, ok, n_cols).to(tl.float32)
    scale = _e4m3_scale(tl.max(tl.abs(v), axis=0))
    tl.store(s_ptr + row * n_blocks + block, scale)
    tl.store(q_ptr + row * n_cols + cols, _to_e4m3(v, scale).to(q_ptr.dtype.element_ty), mask=ok)


def silu_mul_quantize(gate_up: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [T, I] e4m3, scale [T, ceil(I / block)] float32) with each block of `block` values (a power of
    two) of a row of q times its scale ~= silu(gate) * up there, for a contiguous [T, 2 I] gate_up =
    [gate | up]: one program a row and block, as parallel as the unfused SiLU kernel."""
    rows, width = gate_up.shape
    n = width // 2
    blocks = triton.cdiv(n, block)
    q = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=gate_up.device)
    scale = torch.empty((rows, blocks), dtype=torch.float32, device=gate_up.device)
    _silu_mul_quantize_kernel[(rows, blocks)](gate_up, q, scale, n, blocks, BLOCK=block,
                                              num_warps=4 if block >= 1024 else 2, **pdl.options())
    return q, scale
