"""Rotary position embeddings: cos/sin tables for each rope_scaling type (applied in kernels/ops)."""

from __future__ import annotations

import math

import torch

from onebit.models.config import ModelConfig


def llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3's rope scaling of the inverse frequencies (rope_scaling dict `s`): long wavelengths
    divided by the factor, short ones kept, a smooth blend between."""
    factor = s["factor"]
    low, high = s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(dim: int, base: float, s: dict, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    original = s.get("original_max_position_embeddings") or max_pos
    beta_fast, beta_slow = s.get("beta_fast", 32), s.get("beta_slow", 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation_weight = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * ramp + (1 / pos_freqs) * extrapolation_weight
    attention_factor = s.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return inv_freq, attention_factor


def rope_cos_sin(cfg: ModelConfig, max_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables of cos and sin, each [max_len, head_dim], in float32."""
    dim, base = cfg.head_dim, cfg.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scale = 1.0
    s = cfg.rope_scaling
    if s is not None:
        kind = s["rope_type"]
        if kind == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, s)
        elif kind == "freq_factors":  # from a GGUF rope_freqs tensor, one factor per frequency
            inv_freq = inv_freq / torch.tensor(s["factors"], dtype=torch.float64)
        elif kind == "linear":
            inv_freq = inv_freq / s["factor"]
        elif kind == "yarn":
            inv_freq, scale = _yarn_inv_freq(dim, base, s, cfg.max_position_embeddings)
    positions = torch.arange(max_len, dtype=torch.float64)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).float().to(device), (emb.sin() * scale).float().to(device)

