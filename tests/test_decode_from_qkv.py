"""The decode attention straight from the qkv product (`triton_decode.paged_decode_attention_from_qkv`)
against the two-kernel path it replaces (q/k norm + RoPE + cache write, then the attention) and the
plain-torch references, in Triton's interpreter on CPU (float32) or on the GPU."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels import fused_ref
from onebit.kernels.attention import decode_attention_ref

triton_decode = pytest.importorskip("onebit.kernels.triton_decode")
from onebit.kernels import triton_fused  # noqa: E402  (needs triton, as above)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16  # the interpreter's bf16 is not the GPU's
TOLERANCE = {"cpu": 1e-5, "cuda": 2e-2}[DEVICE]
HEADS, KV, DIM, BLOCK = 4, 2, 32, 4


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _rope(max_len):
    from onebit.models.config import ModelConfig
    from onebit.models.rope import rope_cos_sin
    cfg = ModelConfig("Qwen3ForCausalLM", "qwen3", 64, 128, 1, HEADS, KV, DIM, 100)
    return rope_cos_sin(cfg, max_len, torch.device(DEVICE))


def _step(lengths, g):
    """A decode step's rows for sequences of these context lengths (after the step), each with its own
    shuffled blocks: the rows' positions, slots, block tables, context lengths and the cache's block count."""
    positions, slots, tables = [], [], []
    width = max(-(-ctx // BLOCK) for ctx in lengths)
    next_block = 1  # block 0 stays unused
    for ctx in lengths:
        blocks = torch.randperm(width + 2, generator=g)[:-(-ctx // BLOCK)].tolist()
        table = [next_block + b for b in blocks] + [0] * (width - len(blocks))
        next_block += width + 2
        positions.append(ctx - 1)
        slots.append(table[(ctx - 1) // BLOCK] * BLOCK + (ctx - 1) % BLOCK)
        tables.append(table)
    as_tensor = lambda x, dtype=torch.long: torch.tensor(x, dtype=dtype, device=DEVICE)
    lens = [p + 1 for p in positions]
    return as_tensor(positions), as_tensor(slots), as_tensor(tables, torch.int32), as_tensor(lens, torch.int32), next_block


def _caches(blocks, g, fp8):
    k = torch.randn(blocks, BLOCK, KV, DIM, generator=g).to(DEVICE, DTYPE)
    v = torch.randn(blocks, BLOCK, KV, DIM, generator=g).to(DEVICE, DTYPE)
    if not fp8:
        return k, v, None, None
    k_scale = torch.tensor([0.02, 0.03], device=DEVICE)
    v_scale = torch.tensor([0.025, 0.015], device=DEVICE)
    return ((k / k_scale[:, None]).to(torch.float8_e4m3fn), (v / v_scale[:, None]).to(torch.float8_e4m3fn),
            k_scale, v_scale)


CASES = {"short": [9, 1, 23], "several tiles and splits": [70, 130, 5, 64, 65]}  # context lengths


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("splits", [1, 3, None])
@pytest.mark.parametrize("with_norm", [True, False])
@pytest.mark.parametrize("fp8", [False, True])
def test_attention_from_qkv_matches_the_write_then_attend_path(case, splits, with_norm, fp8):
    """Same outputs and cache entries as q/k norm + RoPE + cache write then the decode attention, the rows'
    own cache entries NaN beforehand (the kernel takes them from registers), every other entry untouched."""
    g = torch.Generator().manual_seed(len(case) + 7 * (splits or 0) + with_norm + 2 * fp8)
    positions, slots, tables, lens, blocks = _step(CASES[case], g)
    rows = positions.shape[0]
    cos, sin = _rope(256)
    qkv = torch.randn(rows, (HEADS + 2 * KV) * DIM, generator=g).to(DEVICE, DTYPE)
    qn = (1 + 0.2 * torch.randn(DIM, generator=g)).to(DEVICE, DTYPE) if with_norm else None
    kn = (1 + 0.2 * torch.randn(DIM, generator=g)).to(DEVICE, DTYPE) if with_norm else None
    k_cache, v_cache, k_scale, v_scale = _caches(blocks, g, fp8)
    scale = DIM ** -0.5

    k_two, v_two = k_cache.clone(), v_cache.clone()
    q = triton_fused.qk_norm_rope_store(qkv, positions, cos, sin, qn, kn, 1e-6, slots, k_two, v_two, HEADS, KV,
                                        DIM, k_scale, v_scale)
    want = triton_decode.paged_decode_attention(q, k_two, v_two, tables, lens, scale, splits, None, k_scale,
                                                v_scale)
    plain = decode_attention_ref(q, k_two, v_two, tables, lens, scale, k_scale, v_scale)
    assert _rel(want, plain) < TOLERANCE

    k_one, v_one = k_cache.clone(), v_cache.clone()
    for cache in (k_one, v_one):
        cache.view(-1, KV, DIM)[slots] = torch.tensor(float("nan")).to(cache.dtype)
    got = triton_decode.paged_decode_attention_from_qkv(
        qkv, positions, cos, sin, qn, kn, 1e-6, HEADS, k_one, v_one, tables, lens, scale, splits, None,
        k_scale, v_scale)
    assert got.shape == (rows, HEADS, DIM) and not got.isnan().any()
    assert _rel(got, want) < TOLERANCE
    for mine, theirs, before in ((k_one, k_two, k_cache), (v_one, v_two, v_cache)):
        assert _rel(mine.view(-1, KV, DIM)[slots], theirs.view(-1, KV, DIM)[slots]) < TOLERANCE
        mine, before = mine.float(), before.float()
        mine.view(-1, KV, DIM)[slots] = before.view(-1, KV, DIM)[slots]
        assert torch.equal(mine, before)


def test_the_quantized_output_is_the_block_quantizer_of_the_plain_one():
    """quantize_block: the e4m3 rows and scales `fp8.quantize_row_blocks` makes of the plain output."""
    from onebit.kernels import fp8 as fp8_ops

    g = torch.Generator().manual_seed(3)
    positions, slots, tables, lens, blocks = _step(CASES["short"], g)
    cos, sin = _rope(64)
    qkv = torch.randn(positions.shape[0], (HEADS + 2 * KV) * DIM, generator=g).to(DEVICE, DTYPE)
    k_cache, v_cache, _, _ = _caches(blocks, g, False)
    args = (qkv, positions, cos, sin, None, None, 1e-6, HEADS)
    plain = triton_decode.paged_decode_attention_from_qkv(*args, k_cache.clone(), v_cache.clone(), tables, lens,
                                                          0.2, None, 2)
    rows, scales = triton_decode.paged_decode_attention_from_qkv(*args, k_cache, v_cache, tables, lens, 0.2, None,
                                                                 2, quantize_block=(HEADS // KV) * DIM)
    want_rows, want_scales = fp8_ops.quantize_row_blocks(plain.reshape(rows.shape[0], -1), (HEADS // KV) * DIM)
    assert torch.equal(scales, want_scales)
    assert torch.equal(rows.view(torch.uint8), want_rows.view(torch.uint8))


def test_bad_shapes_get_a_clear_error():
    cos, sin = _rope(16)
    k_cache = torch.zeros(2, BLOCK, KV, DIM, device=DEVICE)
    one = torch.ones(1, dtype=torch.int32, device=DEVICE)
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    wrong_width = torch.zeros(1, (HEADS + KV) * DIM, device=DEVICE)
    with pytest.raises(ValueError, match="qkv"):
        triton_decode.paged_decode_attention_from_qkv(wrong_width, one.long(), cos, sin, None, None, 1e-6, HEADS,
                                                      k_cache, k_cache, table, one, 0.1)
