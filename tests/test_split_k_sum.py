"""Split-K partials handed to their reader unsummed (`split_k_sum.SplitKSum`): every fused reader gives
bit for bit what it gives on the summed product, every split-K producer hands over partials whose
sum is its own result, and a model with the products marked computes the same logits as without
(Triton's interpreter on CPU, the GPU where there is one)."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels import fused_ref, gemv
from onebit.kernels.split_k_sum import SplitKSum, cuda_rows, resolve, sum_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton_split_k = pytest.importorskip("onebit.kernels.triton_split_k")
triton_fused = pytest.importorskip("onebit.kernels.triton_fused")


def _pending(split: int, rows: int, cols: int, scale: bool, bias: bool, dtype: torch.dtype, seed: int) -> SplitKSum:
    g = torch.Generator().manual_seed(seed)
    partial = torch.randn(split, rows, cols, generator=g).to(DEVICE)
    return SplitKSum(partial, torch.rand(cols, generator=g).to(DEVICE) + 0.5 if scale else None,
                     torch.randn(cols, generator=g).to(DEVICE, dtype) if bias else None, dtype)


def _two_launch(pending: SplitKSum) -> torch.Tensor:
    """The partials summed by the reduce kernel, as a product that does not defer its sum stores them."""
    y = torch.empty(pending.shape, dtype=pending.dtype, device=DEVICE)
    triton_split_k.reduce_partials(pending.partial, pending.scale, pending.bias, y)
    return y


# bfloat16 on the GPU only: Triton's interpreter casts float32 to it by truncation (torch and the GPU
# round to nearest) and its bfloat16 arithmetic overflows to NaN.
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
MODEL_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_reduce_kernel_and_the_reference_sum_alike(dtype):
    for split, scale, bias in [(2, False, False), (3, True, True), (4, False, True)]:
        pending = _pending(split, 3, 200, scale, bias, dtype, seed=split)
        assert torch.equal(_two_launch(pending), sum_ref(pending))
        assert torch.equal(pending.result(), sum_ref(pending))
    plain = torch.randn(2, 5)
    assert resolve(plain) is plain


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split,scale,bias", [(2, False, False), (3, True, False), (4, True, True)])
def test_add_rms_norm_reads_partials_as_their_sum(dtype, split, scale, bias):
    pending = _pending(split, 3, 96, scale, bias, dtype, seed=split * 7)
    g = torch.Generator().manual_seed(1)
    residual = torch.randn(3, 96, generator=g).to(DEVICE, dtype)
    weight = torch.randn(96, generator=g).to(DEVICE, dtype)
    summed = _two_launch(pending)
    for res in (residual, None):
        got_out, got_res = triton_fused.add_rms_norm(pending, res, weight, 1e-6)
        want_out, want_res = triton_fused.add_rms_norm(summed, res, weight, 1e-6)
        assert got_out.dtype == dtype and torch.equal(got_out, want_out)
        assert (got_res is None) == (res is None)
        if res is not None:
            assert torch.equal(got_res, want_res)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split,scale,bias", [(2, False, False), (4, True, True)])
def test_silu_mul_reads_partials_as_their_sum(dtype, split, scale, bias):
    pending = _pending(split, 2, 2 * 1100, scale, bias, dtype, seed=split)  # two column blocks of 1,024
    got = triton_fused.silu_mul(pending)
    assert got.dtype == dtype and torch.equal(got, triton_fused.silu_mul(_two_launch(pending)))


def test_the_fp8_quantizing_readers_read_partials_as_their_sum():
    triton_fp8_fused = pytest.importorskip("onebit.kernels.triton_fp8_fused")
    pending = _pending(3, 2, 128, True, True, MODEL_DTYPE, seed=3)
    summed = _two_launch(pending)
    g = torch.Generator().manual_seed(2)
    residual = torch.randn(2, 128, generator=g).to(DEVICE, MODEL_DTYPE)
    weight = torch.randn(128, generator=g).to(DEVICE, MODEL_DTYPE)
    for res in (residual, None):
        got = triton_fp8_fused.add_rms_norm_quantize(pending, res, weight, 1e-6)
        want = triton_fp8_fused.add_rms_norm_quantize(summed, res, weight, 1e-6)
        assert torch.equal(got[0].float(), want[0].float()) and torch.equal(got[1], want[1])
        assert (got[2] is None) == (res is None) and (res is None or torch.equal(got[2], want[2]))
    gate_up = _pending(2, 2, 256, False, False, MODEL_DTYPE, seed=4)
    q, s = triton_fp8_fused.silu_mul_quantize(gate_up)
    q_want, s_want = triton_fp8_fused.silu_mul_quantize(_two_launch(gate_up))
    assert torch.equal(q.float(), q_want.float()) and torch.equal(s, s_want)


def test_the_dispatching_readers_sum_partials_off_triton_too():
    """ops.add_rms_norm / silu_mul on a SplitKSum: the fused kernel where one runs, else the sum then
    the torch reference; either way the reference's numbers on the summed product."""
    from onebit.kernels import ops

    pending = _pending(2, 2, 64, False, True, torch.float32, seed=9)
    weight = torch.randn(64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out, _ = ops.add_rms_norm(pending, None, weight, 1e-6)
    assert torch.allclose(out, fused_ref.rms_norm_ref(sum_ref(pending), weight, 1e-6), atol=1e-5)
    assert torch.allclose(ops.silu_mul(pending), fused_ref.silu_mul_ref(sum_ref(pending)), atol=1e-5)
    assert cuda_rows(pending) == (DEVICE == "cuda")


def test_the_bf16_split_k_product_hands_over_its_partials():
    triton_gemv = pytest.importorskip("onebit.kernels.triton_gemv")
    g = torch.Generator().manual_seed(5)
    x, w, b = (torch.randn(1, 256, generator=g).to(DEVICE), torch.randn(48, 256, generator=g).to(DEVICE),
               torch.randn(48, generator=g).to(DEVICE))
    config = (16, 32, 64, 2, 4)
    pending = triton_gemv.split_k_matmul(x, w, b, config, defer_sum=True)
    assert isinstance(pending, SplitKSum) and pending.partial.shape == (2, 1, 48) and pending.shape == (1, 48)
    assert torch.equal(_two_launch(pending), triton_gemv.split_k_matmul(x, w, b, config))
    whole = triton_gemv.split_k_matmul(x, w, b, (16, 32, 64, 1, 4), defer_sum=True)  # one slice: nothing to sum
    assert isinstance(whole, torch.Tensor)


def test_the_fp8_split_k_product_hands_over_its_partials():
    triton_fp8_fast = pytest.importorskip("onebit.kernels.triton_fp8_fast")
    from onebit.kernels import fp8

    g = torch.Generator().manual_seed(6)
    q, scale = fp8.quantize_rows(torch.randn(40, 512, generator=g).to(DEVICE))
    x = torch.randn(1, 512, generator=g).to(DEVICE, MODEL_DTYPE)
    bias = torch.randn(40, generator=g).to(DEVICE, MODEL_DTYPE)
    for config in [(1, 16, 128, 4, 4), (1, 32, 256, 2, 4)]:
        pending = triton_fp8_fast.split_k(x, q, scale.view(-1), bias, config, defer_sum=True)
        assert isinstance(pending, SplitKSum) and pending.scale is not None
        assert torch.equal(_two_launch(pending), triton_fp8_fast.split_k(x, q, scale.view(-1), bias, config))


def test_the_packed_gguf_product_hands_over_its_partials_only_alone_and_without_bias():
    tr = pytest.importorskip("onebit.kernels.triton_gguf_repacked")
    from onebit.kernels import gguf_quants
    from tests.test_gguf_repacked import _weight

    w = _weight("Q4_K", 40, 512, seed=2)
    x = torch.randn(1, 512, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    config = tr.RepackedConfig("fma", 16, 1, split=2)
    pending = tr.matmul_few_rows(x, w, config=config, defer_sum=True)
    assert isinstance(pending, SplitKSum) and pending.partial.shape[0] == 2
    assert torch.equal(_two_launch(pending), tr.matmul_few_rows(x, w, config=config))
    with pytest.raises(ValueError, match="no out"):
        tr.matmul_few_rows(x, w, torch.empty(1, 40, device=DEVICE), config=config, defer_sum=True)
    bias = torch.randn(40).to(DEVICE)
    # a bias is added after the sum's rounding, and two parts write one output: both sum at once
    assert isinstance(gguf_quants.packed_linear(x, [w], bias, kernels=True, defer_sum=True), torch.Tensor)
    assert isinstance(gguf_quants.packed_linear(x, [w, w], None, kernels=True, defer_sum=True), torch.Tensor)


def test_a_model_with_deferred_sums_computes_the_same_logits(tiny_model_dir, monkeypatch):
    """The tiny Qwen3 with its 1-row products sent to the bf16 split-K kernel (two slices): with the
    products marked, the partials reach the norms and SiLU * mul unsummed and the logits do not move."""
    pytest.importorskip("onebit.kernels.triton_gemv")
    from onebit.kernels.attention import AttentionMetadata
    from onebit.models import transformer
    from onebit.models.loader import load_model
    from onebit.models.rope import rope_cos_sin

    model, cfg = load_model(tiny_model_dir, torch.device(DEVICE), torch.float32)
    for weight, bias in model.linear_weights().values():  # every 1-row product through split-K, 2 slices
        key = (DEVICE, 1, weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
        monkeypatch.setitem(gemv._CHOSEN, key, ("split_k", (16, 32, 32, 2, 4)))
    handed = []
    real_result = SplitKSum.result
    monkeypatch.setattr(SplitKSum, "result", lambda self: handed.append(self.shape) or real_result(self))

    block_size = 16
    kv = torch.zeros(2, cfg.num_layers, 1, block_size, cfg.num_kv_heads, cfg.head_dim, device=DEVICE)
    rope = rope_cos_sin(cfg, 64, torch.device(DEVICE))
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)

    def step(token: int, pos: int) -> torch.Tensor:
        meta = AttentionMetadata(slot_mapping=torch.tensor([pos], device=DEVICE), num_decodes=1,
                                 decode_block_tables=table,
                                 decode_context_lens=torch.tensor([pos + 1], dtype=torch.int32, device=DEVICE),
                                 prefills=[], decode_num_splits=1, decode_max_context=block_size)
        hidden = model(torch.tensor([token], device=DEVICE), torch.tensor([pos], device=DEVICE), kv, meta, rope)
        return model.compute_logits(hidden)

    plain = [step(t, i) for i, t in enumerate([3, 5, 7])]
    assert handed == []
    marked = transformer.defer_split_k_sums(model)
    assert marked == 3 * cfg.num_layers
    kv.zero_()
    deferred = [step(t, i) for i, t in enumerate([3, 5, 7])]
    if DEVICE == "cpu":  # off CUDA the readers sum through `result`; each layer hands over three
        assert len(handed) == 3 * 3 * cfg.num_layers
    assert all(torch.equal(a, b) for a, b in zip(plain, deferred))
