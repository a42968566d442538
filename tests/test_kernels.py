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


# (heads, kv_heads, head_dim, splits): one split (the split kernel quantizes), several (the merge does);
# GQA 4 x 32 = a block of 128 values, GQA 2 x 16 = 32 values, MQA 8 x 32 = 256.
@pytest.mark.parametrize("heads,kv_heads,head_dim,splits", [(8, 2, 32, 1), (8, 2, 32, 3), (4, 2, 16, 2), (8, 1, 32, 1)])
def test_paged_decode_quantizes_its_output_as_the_block_quantizer_would(heads, kv_heads, head_dim, splits):
    from onebit.kernels import fp8

    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16  # the interpreter's bf16 is not the GPU's
    q, k, v, tables, ctx = _case(3, heads, kv_heads, head_dim, 8, [1, 40, 90], seed=heads + splits)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    q[1, :heads // kv_heads] *= 50  # the second row's first group: a larger scale than its other groups
    plain = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.3, num_splits=splits)
    block = heads // kv_heads * head_dim
    got_q, got_s = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.3, num_splits=splits,
                                                         quantize_block=block)
    want_q, want_s = fp8.quantize_row_blocks(plain.reshape(3, -1), block)
    assert got_q.shape == (3, heads * head_dim) and got_s.shape == (3, kv_heads) == want_s.shape
    assert torch.equal(got_s, want_s) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    if kv_heads > 1:
        assert got_s[1, 0] > 2 * got_s[1, 1:].max()
    with pytest.raises(ValueError, match="block"):  # a block that is not one KV head's group
        triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.3, num_splits=splits, quantize_block=2 * block)


def test_paged_decode_writes_into_the_given_output():
    q, k, v, tables, ctx = _case(2, 4, 2, 16, 4, [9, 30], seed=3)
    want = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.25, num_splits=2)
    step = torch.full((5, 4, 16), 7.0, device=DEVICE)  # a mixed step's output: decode rows first
    got = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.25, num_splits=2, out=step[:2])
    assert got.data_ptr() == step.data_ptr() and torch.equal(step[:2], want)
    assert (step[2:] == 7.0).all()  # the prefill rows untouched
    with pytest.raises(ValueError, match="does not fit"):
        triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.25, out=step[:3])


def test_the_merge_reads_only_the_splits_that_hold_keys(monkeypatch):
    """The split kernel stores no partial for a split past a context's end and the merge reads none:
    partial buffers that start as NaN leave every output finite and right."""
    real_empty = torch.empty

    def nan_empty(*shape, dtype=None, device=None, **kw):
        t = real_empty(*shape, dtype=dtype, device=device, **kw)
        return t.fill_(float("nan")) if t.dtype == torch.float32 else t

    q, k, v, tables, ctx = _case(3, 8, 2, 32, 8, [1, 40, 130], seed=4)
    monkeypatch.setattr(triton_decode.torch, "empty", nan_empty)
    for splits, min_split in ((4, None), (None, 16)):
        ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.2, num_splits=splits, max_context=512,
                                                    min_split=min_split)
        assert torch.isfinite(ours).all()
        ref = decode_attention_ref(q, k, v, tables.long(), ctx.long(), 0.2)
        assert ((ours - ref).norm() / ref.norm()).item() < TOLERANCE


def test_a_short_context_spreads_over_one_tile_splits():
    """Splits go down to one 64-key tile (`MIN_SPLIT_TOKENS`): at a 512-token bound B=1 gets eight
    splits, and a 192-token context uses three of them, one tile each; the output stays right."""
    assert triton_decode.MIN_SPLIT_TOKENS == 64
    choose = lambda rows, bound: triton_decode.choose_num_splits(rows, 8, bound, 132)  # noqa: E731
    assert [choose(1, 512), choose(8, 512), choose(1, 8448), choose(64, 512)] == [8, 4, 32, 1]
    q, k, v, tables, ctx = _case(2, 8, 2, 32, 16, [192, 70], seed=9)
    ours = triton_decode.paged_decode_attention(q, k, v, tables, ctx, 0.2, None, 512)
    ref = decode_attention_ref(q, k, v, tables.long(), ctx.long(), 0.2)
    assert ((ours - ref).norm() / ref.norm()).item() < TOLERANCE


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


# -- fused per-token kernels ------------------------------------------------------------------

from onebit.kernels import fused_ref  # noqa: E402

triton_fused = pytest.importorskip("onebit.kernels.triton_fused")
FUSED_TOL = {"cpu": 1e-5, "cuda": 1e-5}[DEVICE]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("cols", [64, 100, 4096])
def test_add_rms_norm_matches_reference(cols):
    g = torch.Generator().manual_seed(cols)
    x, res = torch.randn(7, cols, generator=g), torch.randn(7, cols, generator=g)
    w = 1 + 0.1 * torch.randn(cols, generator=g)
    x, res, w = x.to(DEVICE), res.to(DEVICE), w.to(DEVICE)
    out, summed = triton_fused.add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_sum = fused_ref.add_rms_norm_ref(x, res, w, 1e-6)
    assert _rel(out, ref_out) < FUSED_TOL and _rel(summed, ref_sum) < FUSED_TOL
    plain, none = triton_fused.add_rms_norm(x, None, w, 1e-6)
    assert none is None and _rel(plain, fused_ref.rms_norm_ref(x, w, 1e-6)) < FUSED_TOL


def test_the_wide_norm_matches_reference(monkeypatch):
    """`triton_fused.WIDE_NORM_ROWS`: 64 rows of 4,096 columns on 16 warps (the sums in another order)."""
    monkeypatch.setattr(triton_fused, "WIDE_NORM_ROWS", True)
    g = torch.Generator().manual_seed(64)
    x, res = torch.randn(64, 4096, generator=g).to(DEVICE), torch.randn(64, 4096, generator=g).to(DEVICE)
    w = (1 + 0.1 * torch.randn(4096, generator=g)).to(DEVICE)
    out, summed = triton_fused.add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_sum = fused_ref.add_rms_norm_ref(x, res, w, 1e-6)
    assert _rel(out, ref_out) < FUSED_TOL and _rel(summed, ref_sum) < FUSED_TOL


def test_the_norms_loading_their_weight_before_the_wait_give_the_same_bits(monkeypatch):
    """`pdl.early_weights`: add + RMSNorm, its e4m3 form and its mode-"f16" form load the norm's weight
    before waiting for the previous kernel and return the plain launches' bits."""
    from onebit.kernels import pdl, triton_fp8_fused, triton_gguf_f16

    g = torch.Generator().manual_seed(5)
    x, res = torch.randn(3, 512, generator=g).to(DEVICE), torch.randn(3, 512, generator=g).to(DEVICE)
    w = (1 + 0.1 * torch.randn(512, generator=g)).to(DEVICE)
    norms = [triton_fused.add_rms_norm, triton_fp8_fused.add_rms_norm_quantize, triton_gguf_f16.add_rms_norm_f16]

    def flat(result):  # every tensor a norm returns, F16Rows' fields included
        out = []
        for item in result:
            out.extend(flat(item) if isinstance(item, tuple) else [item])
        return out

    plain = [flat(norm(x, res, w, 1e-6)) for norm in norms]
    monkeypatch.setattr(pdl, "early_weights", lambda: True)
    early = [flat(norm(x, res, w, 1e-6)) for norm in norms]
    for a, b in zip(plain, early):
        assert len(a) == len(b) >= 2 and all(torch.equal(p, e) for p, e in zip(a, b))


def test_silu_mul_matches_reference():
    gu = torch.randn(5, 2 * 1500, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    assert _rel(triton_fused.silu_mul(gu), fused_ref.silu_mul_ref(gu)) < FUSED_TOL


# Heads per program: one; four, so that tiles mix query and key heads and the last tile has two
# value heads and two past the end (6 + 2 + 2 heads); the rule's choice.
@pytest.mark.parametrize("with_norm,per_program", [(True, 1), (False, 1), (True, 4), (False, 4), (True, None)])
def test_qk_norm_rope_store_matches_reference(with_norm, per_program):
    from onebit.models.config import ModelConfig
    from onebit.models.rope import rope_cos_sin
    heads, kv, dim, block, t = 6, 2, 16, 4, 6
    cfg = ModelConfig("Qwen3ForCausalLM", "qwen3", 64, 128, 1, heads, kv, dim, 100)
    cos, sin = rope_cos_sin(cfg, 64, torch.device(DEVICE))
    g = torch.Generator().manual_seed(11)
    qkv = torch.randn(t, (heads + 2 * kv) * dim, generator=g).to(DEVICE)
    positions = torch.tensor([0, 5, 9, 33, 34, 63], device=DEVICE)
    slots = torch.tensor([3, 17, 8, 0, 22, 12], device=DEVICE)
    qn = (1 + 0.1 * torch.randn(dim, generator=g)).to(DEVICE) if with_norm else None
    kn = (1 + 0.1 * torch.randn(dim, generator=g)).to(DEVICE) if with_norm else None
    caches = [torch.full((6, block, kv, dim), float("nan"), device=DEVICE) for _ in range(4)]
    q = triton_fused.qk_norm_rope_store(qkv, positions, cos, sin, qn, kn, 1e-6, slots, caches[0], caches[1],
                                        heads, kv, dim, heads_per_prog=per_program)
    q_ref = fused_ref.qk_norm_rope_store_ref(qkv, positions, cos, sin, qn, kn, 1e-6, slots, caches[2],
                                             caches[3], heads, kv, dim)
    assert _rel(q, q_ref) < FUSED_TOL
    flat = lambda c: c.view(-1, kv, dim)[slots]
    assert _rel(flat(caches[0]), flat(caches[2])) < FUSED_TOL
    assert _rel(flat(caches[1]), flat(caches[3])) < FUSED_TOL
    # slots not written stay untouched (NaN) in both
    assert torch.equal(caches[0].isnan(), caches[2].isnan())


def test_heads_per_program_grows_with_tokens_and_keeps_programs_per_multiprocessor():
    one = 1  # one multiprocessor: at least 4 programs
    assert triton_fused.heads_per_program(1, 48, one) == 8  # 1 x 6 programs
    assert triton_fused.heads_per_program(256, 48, one) == 16  # capped
    assert triton_fused.heads_per_program(1, 3, one) == 1  # never more heads a program than heads
    h200 = 132
    assert triton_fused.heads_per_program(1, 48, h200) == 1  # 48 programs: decoding one row
    assert triton_fused.heads_per_program(16, 48, h200) == 1  # 768 programs, 384 if doubled
    assert triton_fused.heads_per_program(64, 48, h200) == 4  # 768 programs
    assert triton_fused.heads_per_program(256, 48, h200) == 16  # 768 programs
    # the warm-up's steps: the fewest tokens that launch each variant
    firsts = triton_fused.tokens_per_heads_choice(48, h200)
    assert firsts == [1, 22, 44, 88, 176]
    assert [triton_fused.heads_per_program(t, 48, h200) for t in firsts] == [1, 2, 4, 8, 16]
    assert [triton_fused.heads_per_program(t - 1, 48, h200) for t in firsts[1:]] == [1, 2, 4, 8]
    from onebit.kernels import ops
    assert ops.fused_write_warm_up_tokens(48, torch.device("cpu")) == []  # the torch reference runs off CUDA


# -- varlen prefill over the paged cache -------------------------------------------------------

triton_prefill = pytest.importorskip("onebit.kernels.triton_prefill")


@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,chunks", [
    (4, 2, 16, 4, [(5, 5), (3, 20), (1, 9)]),     # fresh prompt, chunk after a cached prefix, a decode
    (8, 1, 32, 16, [(70, 70), (17, 150)]),         # MQA, several query tiles and key tiles
    (4, 4, 16, 8, [(33, 33)]),                     # MHA
])
def test_paged_prefill_matches_reference(heads, kv_heads, head_dim, block_size, chunks):
    from onebit.kernels.attention import prefill_attention_ref
    qlens = [n for n, _ in chunks]
    ctxs = [c for _, c in chunks]
    q_all, k, v, tables, _ = _case(len(chunks), heads, kv_heads, head_dim, block_size, ctxs, seed=sum(ctxs))
    g = torch.Generator().manual_seed(7)
    total = sum(qlens)
    q = torch.randn(total + 3, heads, head_dim, generator=g).to(DEVICE)  # 3 rows outside any chunk
    starts = [sum(qlens[:i]) for i in range(len(qlens))]
    out = torch.full_like(q, float("nan"))
    triton_prefill.paged_prefill_attention(q, k, v, starts, qlens, ctxs, tables, head_dim ** -0.5, out=out)
    assert out[total:].isnan().all()  # rows outside the chunks untouched
    for i, (start, n, ctx) in enumerate(zip(starts, qlens, ctxs)):
        ref = prefill_attention_ref(q[start:start + n], k, v, ctx, tables[i].long(), head_dim ** -0.5)
        assert _rel(out[start:start + n], ref) < TOLERANCE


def test_prefill_tiles_cover_every_query():
    seqs, starts = triton_prefill.prefill_tiles([5, 0, 33], 16)
    assert list(zip(seqs, starts)) == [(0, 0), (2, 0), (2, 16), (2, 32)]
    assert triton_prefill.tokens_per_tile(32, 8) == 16 and triton_prefill.tokens_per_tile(8, 8) == 64
