"""FP8 (e4m3) KV cache: how K and V are stored in one byte and read back.

A cache entry holds `value / scale` rounded to e4m3 (clamped to +-448, the format's largest
finite value), with one float32 scale per layer, K or V, and KV head, fixed for the server's
lifetime (so blocks cached for prefix reuse stay valid). The scales come from a calibration
prefill at start-up (`onebit.engine.kv_calibration`): scale = CALIBRATION_HEADROOM x the largest
|value| seen / 448. e4m3 is a float format, so the headroom costs no relative precision over
most of the range (3 mantissa bits: a relative step of 1/16); values more than the headroom
above the calibration maximum saturate.

The attention kernels read e4m3 entries and dequantize on load: K's scale folds into the score
scale and V's into the output, both per KV head, so a read costs no extra multiply per element.
"""

from __future__ import annotations

import torch

KV_FP8 = torch.float8_e4m3fn
KV_FP8_MAX = 448.0
CALIBRATION_HEADROOM = 2.0
KV_DTYPES = ("auto", "fp8")


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the KV cache for the `--kv-cache-dtype` choice ("auto": the model's dtype)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype == "fp8":
        return KV_FP8
    raise ValueError(f"unknown KV cache dtype {kv_cache_dtype!r}; choose one of {', '.join(KV_DTYPES)}")


def is_fp8(cache: torch.Tensor) -> bool:
    """True when `cache` stores e4m3 entries."""
    return cache.dtype == KV_FP8


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., heads, head_dim] divided by its head's scale [heads], saturated, rounded to e4m3."""
    return (x.float() / scale[:, None]).clamp(-KV_FP8_MAX, KV_FP8_MAX).to(KV_FP8)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 entries q [..., heads, head_dim] times their head's scale [heads], in `dtype`."""
    return (q.float() * scale[:, None]).to(dtype)


def float16_products(fp8: bool, q_dtype: torch.dtype, enabled: bool) -> bool:
    """Whether an attention launch over an e4m3 (`fp8`) cache with queries of `q_dtype` multiplies in
    float16 (q, the keys and values widened from e4m3, the probabilities; float32 accumulation):
    bf16 queries only, where the kernel's switch (`enabled`) allows. Triton widens e4m3 to float16
    in one instruction per two values and to bfloat16 through float32 (SASS: 128 more F2F a
    64-key turn of the decode kernel), which kept the e4m3 decode kernel no faster than bf16's."""
    return fp8 and enabled and q_dtype == torch.bfloat16


def scales_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """Per-head scales for the largest magnitudes seen in calibration (never zero)."""
    return (amax.float() * CALIBRATION_HEADROOM / KV_FP8_MAX).clamp_min(1e-8)
