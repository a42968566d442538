"""The few-row Triton products against F.linear (Triton's interpreter on CPU, or the GPU), and
the dispatch that only ever takes them where a measurement chose them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from onebit.kernels import gemv

triton_gemv = pytest.importorskip("onebit.kernels.triton_gemv")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter computes in true fp32; on the GPU tl.dot takes fp32 inputs as tf32.
TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}[DEVICE]


def _case(m, n, k, bias, seed):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g).to(DEVICE)
    b = torch.randn(n, generator=g).to(DEVICE) if bias else None
    return torch.randn(m, k, generator=g).to(DEVICE), weight, b


@pytest.mark.parametrize("m,n,k,bias", [(1, 37, 300, False), (1, 64, 1024, True), (1, 5, 17, True),
                                        (2, 130, 600, False), (8, 64, 1024, True), (16, 33, 100, True),
                                        (12, 200, 257, False)])
def test_every_candidate_matches_f_linear(m, n, k, bias):
    x, weight, b = _case(m, n, k, bias, seed=m * n * k)
    want = F.linear(x, weight, b)
    pairs = triton_gemv.candidates(m)
    assert pairs and all(kernel in triton_gemv.KERNELS for kernel, _ in pairs)
    for kernel, config in pairs:
        got = triton_gemv.KERNELS[kernel](x, weight, b, config)
        assert got.shape == (m, n)
        assert ((got - want).norm() / want.norm()).item() < TOLERANCE, (kernel, config)


def test_strided_weight_rows():
    """A weight that is a row slice of a wider matrix (row stride > K) reads the right elements."""
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 96, generator=g).to(DEVICE)[:, :64]
    for m in (1, 4):
        x = torch.randn(m, 64, generator=g).to(DEVICE)
        for kernel, config in triton_gemv.candidates(m)[:2]:
            got = triton_gemv.KERNELS[kernel](x, weight, None, config)
            assert ((got - F.linear(x, weight)).norm() / got.norm()).item() < TOLERANCE


def test_more_rows_than_the_kernel_takes_is_refused():
    x, weight, _ = _case(17, 8, 32, False, seed=1)
    assert triton_gemv.candidates(17) == []
    with pytest.raises(ValueError, match="at most 16 rows"):
        triton_gemv.skinny_matmul(x, weight, None, triton_gemv.SKINNY_CONFIGS[0])


def test_nothing_is_chosen_without_a_measurement(tiny_model_dir):
    """On CPU the calibration measures nothing, so every product stays F.linear."""
    from onebit import LLM
    gemv.reset()
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1)
    weights = llm.engine.runner.model.linear_weights()
    assert {"lm_head", "layers.0.self_attn.qkv_proj", "layers.0.mlp.down_proj"} <= set(weights)
    assert gemv.calibrate(weights, [1, 2, 4]) == [] and not gemv._CHOSEN
    w, b = weights["layers.0.self_attn.qkv_proj"]
    x = torch.randn(1, w.shape[1])
    assert torch.equal(gemv.linear(x, w, b), F.linear(x, w, b))
