"""FP8 weights: quantization, the Triton few-row product and the many-row path against their
plain-torch references (Triton's interpreter on CPU, the GPU where there is one), and a model
quantized with `--quantize fp8` against the same model unquantized."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels import fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(m, n, k, bias, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3  # rows of different ranges
    q, scale = fp8.quantize_rows(w)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(m, k, generator=g)
    to = lambda t: t.to(DEVICE) if t is not None else None  # noqa: E731
    return to(x).to(dtype), to(q), to(scale), to(b), w


def test_quantize_rows_round_trips_within_e4m3_precision():
    _, q, scale, _, w = _case(4, 64, 256, False, seed=1)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (64,)
    back = fp8.dequantize_rows(q.cpu(), scale.cpu())
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself, or within the smallest step near 0.
    step = scale.cpu()[:, None] * 2.0 ** -9
    assert ((back - w).abs() <= w.abs() / 16 + step).all()
    assert q.float().abs().max().item() == fp8.FP8_MAX  # each row's largest value maps to the top of the range


def test_values_on_the_grid_round_trip_exactly():
    grid = torch.tensor([[448.0, -1.0, 0.5, 0.0, 3.5, -224.0]])
    q, scale = fp8.quantize_rows(grid * 0.25)
    assert torch.equal(fp8.dequantize_rows(q, scale), grid * 0.25)


triton_fp8 = pytest.importorskip("onebit.kernels.triton_fp8")


@pytest.mark.parametrize("m,n,k,bias", [(1, 37, 300, False), (1, 64, 512, True), (3, 130, 600, False),
                                        (8, 64, 1024, True), (16, 33, 100, True), (17, 40, 64, True),
                                        (70, 96, 256, False), (128, 32, 128, True)])
def test_triton_weight_only_matches_its_reference(m, n, k, bias):
    x, q, scale, b, _ = _case(m, n, k, bias, seed=m * n + k)
    want = fp8.weight_only_ref(x, q, scale, b)
    for config in triton_fp8.CONFIGS[:3] + [triton_fp8.DEFAULT_CONFIG]:
        got = triton_fp8.weight_only(x, q, scale, b, config)
        err = ((got - want).norm() / want.norm()).item()
        assert err < (1e-4 if DEVICE == "cpu" else 2e-3), (config, err)


def test_weight_only_refuses_more_than_max_rows():
    x, q, scale, _, _ = _case(triton_fp8.MAX_ROWS + 1, 32, 64, False, seed=3)
    with pytest.raises(ValueError, match="at most"):
        triton_fp8.weight_only(x, q, scale, None)


def test_many_row_reference_stays_near_the_weight_only_one():
    x, q, scale, b, _ = _case(40, 96, 512, True, seed=5)
    exact = fp8.weight_only_ref(x, q, scale, b)
    both = fp8.w8a8_ref(x, q, scale, b)
    err = ((both - exact).norm() / exact.norm()).item()
    assert 0 < err < 0.05  # activations rounded to e4m3 too: a small, nonzero difference


def test_linear_dispatch_equals_the_reference_off_cuda():
    if DEVICE == "cuda":
        pytest.skip("dispatches to the kernels on CUDA (checked below)")
    x, q, scale, b, _ = _case(20, 48, 128, True, seed=7)
    assert torch.equal(fp8.linear(x, q, scale, b), fp8.weight_only_ref(x, q, scale, b))


@pytest.mark.skipif(DEVICE != "cuda", reason="torch._scaled_mm needs an FP8 GPU")
def test_scaled_mm_matches_the_many_row_reference():
    x, q, scale, b, _ = _case(200, 256, 512, True, seed=9, dtype=torch.bfloat16)
    got = fp8.linear(x, q, scale, b).float()
    want = fp8.w8a8_ref(x.float(), q, scale, b)
    assert ((got - want).norm() / want.norm()).item() < 1e-2


def test_quantized_model_stays_near_the_unquantized_one(tiny_model_dir):
    from onebit import LLM
    from onebit.models.quantize import Fp8Linear
    from tests.model_probe import all_logits

    ids = list(range(5, 40))
    plain = LLM(str(tiny_model_dir), device="cpu", parallel=1)
    want = all_logits(plain, ids)
    quantized = LLM(str(tiny_model_dir), device="cpu", parallel=1, quantize="fp8")
    model = quantized.engine.runner.model
    layers = quantized.engine.model_config.num_layers
    # qkv, o, gate_up, down, and the (tied) head by default
    assert sum(isinstance(m, Fp8Linear) for m in model.modules()) == 4 * layers + 1
    assert isinstance(model.lm_head, Fp8Linear)
    assert not any(type(m).__name__ == "Linear" for m in model.modules())
    got = all_logits(quantized, ids)
    err = ((got - want).norm() / want.norm()).item()
    assert 0 < err < 0.1, err
    assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9
    out = quantized.generate([ids], __import__("onebit").SamplingParams(max_tokens=8, temperature=0))
    assert len(out[0].token_ids) == 8


def test_unknown_quantization_is_refused():
    from onebit.engine.config import EngineConfig

    with pytest.raises(ValueError, match="unknown quantization"):
        EngineConfig(model="x", quantize="int3")
