"""Triton pieces that read a decode step's queries and new keys/values straight from its qkv product.

The decode attention kernel uses them when it takes the qkv rows instead of prepared queries
(`triton_decode.paged_decode_attention_from_qkv`): the q/k norm (Qwen3) and RoPE of
`fused_ref.qk_norm_rope_store_ref` applied in registers, so no kernel between the qkv product and
the attention writes queries or keys. Heads are handled whole: a row [D] and the same row with
its halves swapped (RoPE pairs element i with i + D/2), against the cos/sin tables whose two halves
are equal (`models.rope.rope_cos_sin`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e4m3_value(x, inv_scale):
    """x / scale saturated to e4m3's range and rounded (to nearest) to its 4 significant bits in fp32."""
    # Veltkamp's split makes the store's conversion exact: Triton's interpreter drops the carry when its
    # own fp32 -> e4m3 conversion rounds up (127 became 64), the GPU's does not.
    y = tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0)
    c = y * 1048577.0  # 2**20 + 1
    return c - (c - y)


@triton.jit
def _normed(x, rstd, w):
    # x * rstd rounded to x's dtype, times the norm weight w, rounded again (as the reference rounds)
    return (w * (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)).to(x.dtype)


@triton.jit
def _rotated(y, y_rot, c, s, first):
    # rotary of heads y (y_rot: halves swapped) with the position's cos c and sin s; `first` marks the first half
    g, g_rot = y.to(tl.float32), y_rot.to(tl.float32)
    return tl.where(first, g * c - g_rot * s, g * c + g_rot * s).to(y.dtype)


@triton.jit
def step_queries(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, seq, heads, row_ok, dims, stride_row, eps,
                 HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    """Query heads `heads` [R] (those where row_ok) of the step's row `seq`, normed and rotated: [R, D]."""
    rot = (dims + HEAD_DIM // 2) % HEAD_DIM
    base = qkv_ptr + seq.to(tl.int64) * stride_row + heads[:, None] * HEAD_DIM
    x = tl.load(base + dims[None, :], mask=row_ok[:, None], other=0.0)
    x_rot = tl.load(base + rot[None, :], mask=row_ok[:, None], other=0.0)
    if HAS_NORM:
        f = x.to(tl.float32)
        rstd = (1.0 / tl.sqrt(tl.sum(f * f, axis=1) / HEAD_DIM + eps))[:, None]
        x, x_rot = (_normed(x, rstd, tl.load(qn_ptr + dims).to(tl.float32)[None, :]),
                    _normed(x_rot, rstd, tl.load(qn_ptr + rot).to(tl.float32)[None, :]))
    pos = tl.load(pos_ptr + seq).to(tl.int64)
    c = tl.load(cos_ptr + pos * HEAD_DIM + dims)[None, :]
    s = tl.load(sin_ptr + pos * HEAD_DIM + dims)[None, :]
    return _rotated(x, x_rot, c, s, (dims < HEAD_DIM // 2)[None, :])


@triton.jit
def step_key_value(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, kn_ptr, k_scale_ptr, v_scale_ptr, k_cache_ptr, v_cache_ptr,
                   seq, kv_head, dims, stride_row, eps, NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr,
                   HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, KV_FP8: tl.constexpr):
    """The step's key and value [D] of KV head kv_head for row `seq` (its key normed and rotated) as the caches
    hold them: in their dtype, an e4m3 cache's as value / its head's scale (the key rounded to the model's
    dtype first, as the reference does)."""
    rot = (dims + HEAD_DIM // 2) % HEAD_DIM
    row = qkv_ptr + seq.to(tl.int64) * stride_row
    key = row + (NUM_HEADS + kv_head) * HEAD_DIM
    x = tl.load(key + dims)
    x_rot = tl.load(key + rot)
    if HAS_NORM:
        f = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(f * f, axis=0) / HEAD_DIM + eps)
        x, x_rot = (_normed(x, rstd, tl.load(kn_ptr + dims).to(tl.float32)),
                    _normed(x_rot, rstd, tl.load(kn_ptr + rot).to(tl.float32)))
    pos = tl.load(pos_ptr + seq).to(tl.int64)
    c = tl.load(cos_ptr + pos * HEAD_DIM + dims)
    s = tl.load(sin_ptr + pos * HEAD_DIM + dims)
    k = _rotated(x, x_rot, c, s, dims < HEAD_DIM // 2)
    v = tl.load(row + (NUM_HEADS + NUM_KV + kv_head) * HEAD_DIM + dims)
    if KV_FP8:
        k = e4m3_value(k, 1.0 / tl.load(k_scale_ptr + kv_head))
        v = e4m3_value(v, 1.0 / tl.load(v_scale_ptr + kv_head))
    return k.to(k_cache_ptr.dtype.element_ty), v.to(v_cache_ptr.dtype.element_ty)
