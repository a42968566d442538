"""Triton pieces that read a step's queries and newest keys/values straight from its qkv product.

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
def _norm_rope(x, x_rot, w_ptr, pos, cos_ptr, sin_ptr, dims, rot, eps,
               HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    # Heads x [R, D] (x_rot: the same with halves swapped) at positions pos [R]: RMSNorm over each head with
    # the weight at w_ptr (with HAS_NORM), then rotary; each step rounded to x's dtype as the reference does.
    y, y_rot = x, x_rot
    if HAS_NORM:
        f, f_rot = x.to(tl.float32), x_rot.to(tl.float32)
        rstd = (1.0 / tl.sqrt(tl.sum(f * f, axis=1) / HEAD_DIM + eps))[:, None]
        w = tl.load(w_ptr + dims).to(tl.float32)[None, :]
        w_rot = tl.load(w_ptr + rot).to(tl.float32)[None, :]
        y = (w * (f * rstd).to(x.dtype).to(tl.float32)).to(x.dtype)
        y_rot = (w_rot * (f_rot * rstd).to(x.dtype).to(tl.float32)).to(x.dtype)
    table = pos.to(tl.int64)[:, None] * HEAD_DIM + dims[None, :]
    c = tl.load(cos_ptr + table)
    s = tl.load(sin_ptr + table)
    g, g_rot = y.to(tl.float32), y_rot.to(tl.float32)
    first = (dims < HEAD_DIM // 2)[None, :]
    return tl.where(first, g * c - g_rot * s, g * c + g_rot * s).to(x.dtype)


@triton.jit
def step_queries(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, qn_ptr, seq, heads, row_ok, dims, stride_row, eps,
                 HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    """Query heads `heads` [R] (those where row_ok) of the step's row `seq`, normed and rotated: [R, D]."""
    rot = (dims + HEAD_DIM // 2) % HEAD_DIM
    base = qkv_ptr + seq.to(tl.int64) * stride_row + heads[:, None] * HEAD_DIM
    x = tl.load(base + dims[None, :], mask=row_ok[:, None], other=0.0)
    x_rot = tl.load(base + rot[None, :], mask=row_ok[:, None], other=0.0)
    pos = tl.load(pos_ptr + seq + heads * 0)
    return _norm_rope(x, x_rot, qn_ptr, pos, cos_ptr, sin_ptr, dims, rot, eps, HEAD_DIM, HAS_NORM)


@triton.jit
def step_keys_values(k, v, qkv_ptr, pos_ptr, cos_ptr, sin_ptr, kn_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr,
                     v_scale_ptr, offs, seq, kv_head, tokens, tok_ok, first_new, newest, dims, stride_row, eps,
                     NUM_HEADS: tl.constexpr, NUM_KV: tl.constexpr, HEAD_DIM: tl.constexpr,
                     HAS_NORM: tl.constexpr, KV_FP8: tl.constexpr):
    """A key tile's keys and values k, v [TILE, D] (already in the products' dtype) with the tokens this step
    computes (first_new..newest of sequence row `seq`, held by the rows just before it) taken from their qkv
    rows, normed and rotated, and the row's own token (newest) stored into the caches at its offset in
    `offs`. An e4m3 cache gets (and the tile carries) value / its head's scale, rounded as the cache holds it."""
    new = tok_ok & (tokens >= first_new)
    rows = tl.where(new, seq - (newest - tokens), seq).to(tl.int64)
    rot = (dims + HEAD_DIM // 2) % HEAD_DIM
    base = qkv_ptr + rows[:, None] * stride_row
    key = base + (NUM_HEADS + kv_head) * HEAD_DIM
    x = tl.load(key + dims[None, :], mask=new[:, None], other=0.0)
    x_rot = tl.load(key + rot[None, :], mask=new[:, None], other=0.0)
    pos = tl.load(pos_ptr + rows, mask=new, other=0)
    k_new = _norm_rope(x, x_rot, kn_ptr, pos, cos_ptr, sin_ptr, dims, rot, eps, HEAD_DIM, HAS_NORM)
    v_new = tl.load(base + (NUM_HEADS + NUM_KV + kv_head) * HEAD_DIM + dims[None, :], mask=new[:, None], other=0.0)
    if KV_FP8:
        k_new = e4m3_value(k_new, 1.0 / tl.load(k_scale_ptr + kv_head)).to(k_cache_ptr.dtype.element_ty)
        v_new = e4m3_value(v_new, 1.0 / tl.load(v_scale_ptr + kv_head)).to(v_cache_ptr.dtype.element_ty)
    else:
        k_new, v_new = k_new.to(k_cache_ptr.dtype.element_ty), v_new.to(v_cache_ptr.dtype.element_ty)
    mine = (tok_ok & (tokens == newest))[:, None]
    tl.store(k_cache_ptr + offs[:, None] + dims[None, :], k_new, mask=mine)
    tl.store(v_cache_ptr + offs[:, None] + dims[None, :], v_new, mask=mine)
    return tl.where(new[:, None], k_new.to(k.dtype), k), tl.where(new[:, None], v_new.to(v.dtype), v)
