"""Plain-torch references of the fused per-token operations (CPU path, and what Triton is checked against).

Each follows the rounding of transformers' implementation: norms compute in float32,
round to the model dtype, then multiply by the weight in that dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from onebit.kernels import kv_fp8


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last dimension."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by per-token cos/sin [T, head_dim] (rotate-half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos[:, None, :] + rotated.float() * sin[:, None, :]).to(x.dtype)


def qk_norm_rope_store_ref(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                           q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                           slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           num_heads: int, num_kv_heads: int, head_dim: int,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Split qkv [T, (H + 2 KV) * D], norm q and k per head (Qwen3), rotate them, write k and v
    to the cache at slot_mapping; return q [T, H, D]. An e4m3 cache stores k / k_scale and
    v / v_scale (per KV head; `kernels.kv_fp8`)."""
    t = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(t, num_heads, head_dim)
    k = k.reshape(t, num_kv_heads, head_dim)
    v = v.reshape(t, num_kv_heads, head_dim)
    if q_norm is not None:
        q, k = rms_norm_ref(q, q_norm, eps), rms_norm_ref(k, k_norm, eps)
    c, s = cos[positions], sin[positions]
    q, k = rope_ref(q, c, s), rope_ref(k, c, s)
    if kv_fp8.is_fp8(k_cache):  # copied as bytes: CPU torch has no index_copy_ for e4m3
        k, v = kv_fp8.quantize(k, k_scale).view(torch.uint8), kv_fp8.quantize(v, v_scale).view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)
    return q
