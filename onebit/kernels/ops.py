"""The model's fused per-token operations: Triton on CUDA, the torch reference elsewhere."""

from __future__ import annotations

import torch

from onebit.kernels import fused_ref

try:
    from onebit.kernels import triton_argmax, triton_fused
except ImportError:  # pragma: no cover - depends on the install
    triton_argmax = triton_fused = None


def _triton(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_fused is not None


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(rms_norm(x + residual), x + residual); with residual None: (rms_norm(x), None)."""
    if _triton(x) and x.dim() == 2 and x.is_contiguous():
        return triton_fused.add_rms_norm(x, residual, weight, eps)
    if residual is None:
        return fused_ref.rms_norm_ref(x, weight, eps), None
    return fused_ref.add_rms_norm_ref(x, residual, weight, eps)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest value, the first on ties: torch.argmax(logits, dim=-1) for logits
    [rows, vocab] (the two-pass `triton_argmax` kernel on CUDA)."""
    if _triton(logits) and logits.dim() == 2 and logits.stride(-1) == 1:
        return triton_argmax.argmax_rows(logits)
    return logits.argmax(dim=-1)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up]."""
    if _triton(gate_up) and gate_up.is_contiguous():
        return triton_fused.silu_mul(gate_up)
    return fused_ref.silu_mul_ref(gate_up)


def qk_norm_rope_store(qkv, positions, cos, sin, q_norm, k_norm, eps, slot_mapping, k_cache, v_cache,
                       num_heads, num_kv_heads, head_dim, k_scale=None, v_scale=None):
    """q/k norm (when given), RoPE, and the K/V cache write for one layer; returns q [T, H, D].
    An e4m3 cache takes the per-KV-head scales k_scale and v_scale."""
    if _triton(qkv) and qkv.stride(-1) == 1 and k_cache.is_contiguous():
        return triton_fused.qk_norm_rope_store(qkv, positions, cos, sin, q_norm, k_norm, eps, slot_mapping,
                                               k_cache, v_cache, num_heads, num_kv_heads, head_dim,
                                               k_scale, v_scale)
    return fused_ref.qk_norm_rope_store_ref(qkv, positions, cos, sin, q_norm, k_norm, eps, slot_mapping,
                                            k_cache, v_cache, num_heads, num_kv_heads, head_dim, k_scale, v_scale)


def fused_write_warm_up_tokens(heads: int, device: torch.device) -> list[int]:
    """Token counts, one per variant of the fused q/k/v write that steps on `device` can launch
    (`heads` query + key + value heads), for a warm-up to compile them all; none off CUDA."""
    if device.type != "cuda" or triton_fused is None:
        return []
    return triton_fused.tokens_per_heads_choice(heads, triton_fused.sm_count(device))
