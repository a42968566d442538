"""The one-row Triton GEMV against F.linear (Triton's interpreter on CPU, or the GPU), and the
dispatch that only ever takes it where a measurement chose it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from onebit.kernels import gemv

triton_gemv = pytest.importorskip("onebit.kernels.triton_gemv")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n,k,bias", [(37, 300, False), (64, 1024, True), (5, 17, True), (130, 2100, False)])
def test_every_config_matches_f_linear(n, k, bias):
    g = torch.Generator().manual_seed(n * k)
    weight = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE) if bias else None
    x = torch.randn(1, k, generator=g).to(DEVICE)
    want = F.linear(x, weight, b)
    for config in triton_gemv.CONFIGS:
        got = triton_gemv.gemv(x, weight, b, config)
        assert got.shape == (1, n)
        assert ((got - want).norm() / want.norm()).item() < 1e-4, config


def test_strided_weight_rows():
    """A weight that is a row slice of a wider matrix (row stride > K) reads the right elements."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(40, 96, generator=g).to(DEVICE)
    weight = wide[:, :64]
    x = torch.randn(1, 64, generator=g).to(DEVICE)
    got = triton_gemv.gemv(x, weight, None, triton_gemv.CONFIGS[1])
    assert torch.allclose(got, F.linear(x, weight), rtol=1e-4, atol=1e-4)


def test_nothing_is_chosen_without_a_measurement(tiny_model_dir):
    """On CPU the calibration measures nothing, so every product stays F.linear."""
    from onebit import LLM
    gemv.reset()
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1)
    weights = llm.engine.runner.model.linear_weights()
    assert {"lm_head", "layers.0.self_attn.qkv_proj", "layers.0.mlp.down_proj"} <= set(weights)
    assert gemv.calibrate(weights) == [] and not gemv._CHOSEN
    w, b = weights["layers.0.self_attn.qkv_proj"]
    x = torch.randn(1, w.shape[1])
    assert torch.equal(gemv.linear(x, w, b), F.linear(x, w, b))
