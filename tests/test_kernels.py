"""Triton kernels against their plain-torch references (Triton's interpreter on CPU, or the GPU)."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels.attention import decode_attention_ref

triton_decode = pytest.importorskip("onebit.kernels.triton_decode")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter computes in true fp32; on the GPU tl.dot takes fp32 inputs as tf32.
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}[DEVICE]


def _case(batch, heads, kv_heads, head_dim, block_size, lens, seed):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    q = torch.randn(batch, heads, head_dim, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()  # scattered, not contiguous, blocks
    width = max(-(-n // block_size) for n in lens)
    tables = torch.zeros(batch, width, dtype=torch.int32)
    for i, n in enumerate(lens):
        for j in range(-(-n // block_size)):
            tables[i, j] = perm.pop()
    to = lambda t: t.to(DEVICE)
    return to(q), to(k), to(v), to(tables), to(torch.tensor(lens, dtype=torch.int32))


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,lens,splits", [
    (4, 2, 16, 4, [1, 7, 33, 64], 1),        # GQA 2, several tiles, partial blocks
    (8, 1, 32, 16, [5, 100], 3),              # MQA, split context, one split empty for the short one
    (4, 4, 16, 8, [130], 4),                  # MHA, long context across splits
    (16, 2, 64, 16, [17, 1, 250], 2),         # GQA 8
])
def test_paged_decode_matches_reference(heads, kv_heads, head_dim, block_size, lens, splits):
    for seed in range(2):
        q, k, v, tables, ctx = _case(len(lens), heads, kv_heads, head_dim, block_size, lens, seed)
        scale = head_dim ** -0.5
        ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, scale, num_splits=splits)
        ref = decode_attention_ref(q, k, v, tables.long(), ctx.long(), scale)
        assert torch.isfinite(ours).all()
        rel = ((ours - ref).norm() / ref.norm()).item()
        assert rel < TOLERANCE, rel


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 tensor-core path needs the GPU")
def test_paged_decode_bf16_on_gpu():
    q, k, v, tables, ctx = _case(3, 32, 8, 128, 16, [128, 300, 1000], seed=5)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 128 ** -0.5, num_splits=2).float()
    ref = decode_attention_ref(q.double(), k.double(), v.double(), tables.long(), ctx.long(), 128 ** -0.5)
    assert ((ours - ref.float()).norm() / ref.norm()).item() < 1e-2


def test_split_choice():
    assert triton_decode.pick_num_splits(100) == 1
    assert triton_decode.pick_num_splits(1500) == 3
    assert triton_decode.pick_num_splits(10**6) == 16
