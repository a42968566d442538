"""Triton kernels that emit a product's FP8 input directly: add + RMSNorm and SiLU * mul, each
ending in the per-token e4m3 quantization `_scaled_mm` wants (one scale per row).

With FP8 weights, a product of many rows runs `torch._scaled_mm` on e4m3 activations. Its input
used to be written in bf16 by the norm (or SiLU * mul) kernel, then read again by the one-pass
quantizer (`triton_fp8_fast.quantize_rows`): two launches and a round trip of the activations.
Here the producing kernel rounds its result to the model's dtype exactly as the unfused kernel
stores it, takes the row's absolute maximum and writes e4m3 values and the row's scale instead,
so the numbers are the ones the separate quantizer would have produced from the stored result.

Constructs as in the kernels already run on the device: one program per row, the norm's row in
one block (`triton_fused._add_rms_norm_kernel`), the SiLU row in one block too up to
MAX_ONE_BLOCK values (an 8B's 12,288: one load of the row, every value in registers), else walked
twice in blocks (amax, then quantize; the second read comes from the cache, as in
`triton_fp8_fast._quantize_rows_kernel`), IEEE division (`div_rn`) and the exact e4m3 rounding
of `triton_fp8_fast._round_to_e4m3`. Both wait for the previous kernel under PDL, as the kernels
around them do. Session 9 timed the SiLU kernel walking the row in blocks at 0.82-0.99x the
unfused pair (64 programs streaming one block after another at 64 rows), session 14 the one-block
form at 0.74-0.83x (1.02x at 64 rows; separate runs, so not a clean A/B of the two forms): the
model fuses only the norms (`models.quantize.FUSED_PRODUCERS`).
References: `onebit.kernels.fp8.add_rms_norm_quantize_ref` and `fp8.silu_mul_quantize_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl
from onebit.kernels.triton_fp8_fast import FP8_MAX, _round_to_e4m3
from onebit.kernels.triton_fused import _add_rms_norm_row, _silu_mul_row


@triton.jit
def _add_rms_norm_quantize_kernel(x_ptr, res_ptr, w_ptr, q_ptr, s_ptr, res_out_ptr, n_cols, eps,
                                  HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    # The value the unfused kernel stores (rounded to x's dtype), then quantized as a row.
    out = _add_rms_norm_row(x_ptr, res_ptr, w_ptr, res_out_ptr, row, cols, ok, n_cols, eps, HAS_RESIDUAL)
    out = out.to(tl.float32)
    scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(out), axis=0), 1e-12), FP8_MAX)
    tl.store(s_ptr + row, scale)
    q = _round_to_e4m3(tl.minimum(tl.maximum(tl.math.div_rn(out, scale), -FP8_MAX), FP8_MAX))
    tl.store(q_ptr + row * n_cols + cols, q.to(q_ptr.dtype.element_ty), mask=ok)


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
                                           num_warps=8 if block >= 4096 else 4, **pdl.options())
    return q, scale, (res_out if residual is not None else None)


MAX_ONE_BLOCK = 16384  # SiLU rows up to this many values are quantized from registers, one load each


@triton.jit
def _quantize_store(v, scale, q_ptr, cols, ok):
    q = _round_to_e4m3(tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -FP8_MAX), FP8_MAX))
    tl.store(q_ptr + cols, q.to(q_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_quantize_kernel(gu_ptr, q_ptr, s_ptr, n_cols, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr,
                              PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
    row = tl.program_id(0).to(tl.int64)
    gu_row = gu_ptr + row * 2 * n_cols
    q_row = q_ptr + row * n_cols
    if ONE_BLOCK:
        cols = tl.arange(0, BLOCK)
        ok = cols < n_cols
        v = _silu_mul_row(gu_row, cols, ok, n_cols).to(tl.float32)
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(v), axis=0), 1e-12), FP8_MAX)
        tl.store(s_ptr + row, scale)
        _quantize_store(v, scale, q_row, cols, ok)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, n_cols, BLOCK):
            cols = k0 + tl.arange(0, BLOCK)
            amax = tl.maximum(amax, tl.abs(_silu_mul_row(gu_row, cols, cols < n_cols, n_cols).to(tl.float32)))
        scale = tl.math.div_rn(tl.maximum(tl.max(amax, axis=0), 1e-12), FP8_MAX)
        tl.store(s_ptr + row, scale)
        for k0 in range(0, n_cols, BLOCK):  # computed again from the cached row rather than stored in between
            cols = k0 + tl.arange(0, BLOCK)
            ok = cols < n_cols
            _quantize_store(_silu_mul_row(gu_row, cols, ok, n_cols).to(tl.float32), scale, q_row, cols, ok)


def silu_mul_quantize(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [T, I] e4m3, scale [T, 1] float32) with q * scale ~= silu(gate) * up, for a contiguous
    [T, 2 I] gate_up = [gate | up]."""
    rows, width = gate_up.shape
    n = width // 2
    q = torch.empty((rows, n), dtype=torch.float8_e4m3fn, device=gate_up.device)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=gate_up.device)
    one_block = n <= MAX_ONE_BLOCK
    block = triton.next_power_of_2(n) if one_block else 2048
    warps = 16 if block >= 8192 else 8 if block >= 2048 else 4
    _silu_mul_quantize_kernel[(rows,)](gate_up, q, scale, n, BLOCK=block, ONE_BLOCK=one_block, num_warps=warps,
                                       **pdl.options())
    return q, scale
