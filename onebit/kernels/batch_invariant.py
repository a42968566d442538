"""Batch-invariant products and attention (`--deterministic`): a row's result never depends on
how many rows share the step or where the row sits.

In bf16 a product computed for 1 row and for 64 takes different cuBLAS kernels with different
reduction orders, and attention for a token computed in a prefill chunk, a verification row or
a decode step takes different kernels too; near-tied logits then flip. While `mode(True)` is
active (the runner enters it around every forward of a deterministic engine, CUDA-graph capture
included), `gemv.linear` and `attention.paged_attention` come here instead:

- `linear`: on CUDA the Triton kernel of `triton_invariant_matmul` (one BLOCK_K, one K order,
  no split-K, for every M); elsewhere `matmul_ref`, which only multiplies and adds elementwise
  in float32, in a fixed pairwise order along K.
- `attention`: on CUDA the kernel of `triton_invariant_attention`, which computes every query
  token (decode row, verification row or prefill token) as the same fixed KV splits merged in the
  same order; elsewhere `attention_rows_ref`, one query token at a time over exactly its context.

RMSNorm, SiLU*mul, q/k norm + RoPE and the sampler's argmax are already row-local (one program,
or one row of a torch op, per token, the same for every row), so they need nothing here.
Both references are batch-invariant themselves on CPU in bf16: every op they run on a row has
shapes that depend on that row alone, and sums are folds of elementwise adds.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F

try:  # the GPU kernels need triton; without it every path uses the torch references
    from onebit.kernels import triton_invariant_attention, triton_invariant_matmul
except ImportError:  # pragma: no cover - depends on the install
    triton_invariant_attention = triton_invariant_matmul = None

_state = threading.local()
FOLD = 32  # the K chunk of the reference product: a power of two, folded pairwise


def enabled() -> bool:
    """True inside `mode(True)` on this thread."""
    return getattr(_state, "on", False)


@contextmanager
def mode(on: bool):
    """Route products and attention through the batch-invariant kernels (on=True) for the block."""
    previous = enabled()
    _state.on = on
    try:
        yield
    finally:
        _state.on = previous


def _fold(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last dimension by pairwise halving after zero-padding it to a power of two.
    Only elementwise adds, so every element of the result is summed in the same order whatever
    the other dimensions; and padding with more zeros never changes a sum (x + 0 == x)."""
    n = t.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        t = F.pad(t, (0, width - n))
    while t.shape[-1] > 1:
        half = t.shape[-1] // 2
        t = t[..., :half] + t[..., half:]
    return t[..., 0]


def matmul_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               splits: int = 1) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T + bias in float32, each output summed over K in FOLD-wide chunks
    (pairwise inside a chunk, chunk after chunk), then rounded to x's dtype. Row i of the result
    depends on x[i] alone, bit for bit. With `splits` > 1, the structure of the GPU kernel's fixed
    split-K: K is cut at `triton_invariant_matmul.chunk_len(K, splits)` boundaries, each piece
    summed as above from zero, and the partials added in split order, then the bias."""
    m, k = x.shape
    n = weight.shape[0]
    chunk = k if splits <= 1 else _split_len(k, splits)
    total = None
    rows = max(1, (1 << 22) // max(n * FOLD, 1))  # bound the [rows, N, FOLD] product tensor
    wf = weight.float()
    for s0 in range(0, k, chunk) if k else [0]:
        acc = torch.zeros((m, n), dtype=torch.float32, device=x.device)
        for r0 in range(0, m, rows):
            xr = x[r0:r0 + rows].float()
            for k0 in range(s0, min(s0 + chunk, k), FOLD):
                end = min(k0 + FOLD, s0 + chunk)
                acc[r0:r0 + rows] += _fold(xr[:, None, k0:end] * wf[None, :, k0:end])
        total = acc if total is None else total + acc
    if bias is not None:
        total += bias.float()
    return total.to(x.dtype)


def _split_len(k: int, splits: int) -> int:
    """The K length of one split, as the GPU kernel cuts it (kept here too for CPU-only installs)."""
    if triton_invariant_matmul is not None:
        return triton_invariant_matmul.chunk_len(k, splits)
    per_split = -(-k // splits)
    return 256 * -(-per_split // 256)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Batch-invariant F.linear(x, weight, bias) for x [..., K]."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.is_cuda and triton_invariant_matmul is not None:
        out = triton_invariant_matmul.matmul(flat.contiguous(), weight, bias)
    else:
        out = matmul_ref(flat, weight, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def attention_row_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                      context_len: int, scale: float) -> torch.Tensor:
    """Attention of one query token q [heads, head_dim] over the first context_len cached tokens
    of its block table, in float32 with folded sums; returns [heads, head_dim] in q's dtype."""
    num_heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    used = table[:-(-context_len // block_size)].long()
    keys = k_cache[used].reshape(-1, kv_heads, head_dim)[:context_len].float().transpose(0, 1)
    values = v_cache[used].reshape(-1, kv_heads, head_dim)[:context_len].float().permute(1, 2, 0)
    qg = q.float().view(kv_heads, group, 1, head_dim)
    scores = _fold(qg * keys[:, None]) * scale  # [kv, group, context]
    probs = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    total = _fold(probs)
    out = _fold(probs[:, :, None, :] * values[:, None]) / total[..., None]  # [kv, group, head_dim]
    return out.reshape(num_heads, head_dim).to(q.dtype)


def query_rows(meta) -> list[tuple[int, int, int]]:
    """(packed token, row of the step's block tables, context length through that token) for
    every query token of a step; decode rows first, their tables first (see `combined_tables`)."""
    lens = meta.decode_context_lens.tolist() if meta.num_decodes else []
    rows = [(i, i, lens[i]) for i in range(meta.num_decodes)]
    for j, (start, n, ctx) in enumerate(meta.prefills):
        rows += [(start + t, meta.num_decodes + j, ctx - n + t + 1) for t in range(n)]
    return rows


def combined_tables(meta) -> torch.Tensor:
    """The decode and prefill block tables as one [rows, width] tensor, decode rows first."""
    tables = [t for t in (meta.decode_block_tables, meta.prefill_block_tables) if t is not None and t.numel()]
    width = max(t.shape[1] for t in tables)
    return torch.cat([F.pad(t, (0, width - t.shape[1])) for t in tables])


def attention_rows_ref(q, k_cache, v_cache, meta, scale: float) -> torch.Tensor:
    """Batch-invariant attention of a packed step q [T, heads, head_dim]: each token alone."""
    out = torch.empty_like(q)
    tables = combined_tables(meta)
    for token, table_row, context_len in query_rows(meta):
        out[token] = attention_row_ref(q[token], k_cache, v_cache, tables[table_row], context_len, scale)
    return out


def split_len(meta, head_dim: int) -> int:
    """The KV split length of the GPU kernel: fixed per engine (its context size and split count),
    a multiple of the kernel's key tile, never dependent on the step."""
    tile = triton_invariant_attention.key_tile(head_dim)
    per_split = -(-meta.decode_max_context // max(meta.decode_num_splits, 1))
    return tile * -(-per_split // tile)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float) -> torch.Tensor:
    """Batch-invariant paged attention for a packed step (`attention.paged_attention`'s contract)."""
    if not (q.is_cuda and triton_invariant_attention is not None and meta.decode_max_context):
        return attention_rows_ref(q, k_cache, v_cache, meta, scale)
    length = split_len(meta, q.shape[-1])
    num_splits = -(-meta.decode_max_context // length)
    if meta.num_decodes == 0:  # only prefill chunks: no more splits than the longest context needs
        num_splits = min(num_splits, -(-max(ctx for _, _, ctx in meta.prefills) // length))
    tiles = getattr(meta, "_invariant_tiles", None)
    if tiles is None:  # once per step (and per graph capture), not once per layer
        if meta.prefills:
            tiles = triton_invariant_attention.plan_tiles(meta, q.shape[1] // k_cache.shape[2], combined_tables(meta))
        else:
            tiles = triton_invariant_attention.decode_tiles(meta.decode_block_tables, meta.decode_context_lens)
        meta._invariant_tiles = tiles
    return triton_invariant_attention.packed(q, k_cache, v_cache, tiles, scale, length, num_splits)
