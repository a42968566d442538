"""Decoder norms folded into the products after them (`transformer.FOLD_NORMS`): the gemv kernel's
norm and residual forms against plain torch, and a one-row step of a folded model against the plain
model (Triton's interpreter on CPU, or the GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from onebit.kernels import gemv, ops, pdl

triton_gemv = pytest.importorskip("onebit.kernels.triton_gemv")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16  # the interpreter's bf16 is not the GPU's
# fp32 in the interpreter: rounding only; bf16 on the GPU: the fold rounds weight x norm weight once more
TOLERANCE = {"cpu": 1e-5, "cuda": 2e-2}[DEVICE]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _rms_norm(x, w, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


@pytest.mark.parametrize("n,k,config", [(74, 300, (4, 1024, 4)), (64, 1024, (8, 512, 4)), (10, 17, (16, 256, 4))])
@pytest.mark.parametrize("early", [False, True])
def test_the_norm_folded_into_gemv_is_the_product_of_the_normed_row(n, k, config, early, monkeypatch):
    """gemv(x, fold(W, g), b, norm_eps) = linear(rms_norm(x) * g, W, b), plain and gated (SiLU * mul), K a
    whole tile or not, with and without the early first tile; the residual form adds the row exactly."""
    monkeypatch.setattr(pdl, "early_weights", lambda: early)
    g = torch.Generator().manual_seed(n + k)
    x = (3 * torch.randn(1, k, generator=g)).to(DEVICE, DTYPE)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).to(DEVICE, DTYPE)
    b = torch.randn(n, generator=g).to(DEVICE, DTYPE)
    gamma = (1 + 0.3 * torch.randn(k, generator=g)).to(DEVICE, DTYPE)
    folded = gemv.fold_norm_into(w, gamma)
    normed = _rms_norm(x, gamma, 1e-6)
    want = F.linear(normed, w.float(), b.float())
    got = triton_gemv.gemv(x, folded, b, config, norm_eps=1e-6)
    assert got.dtype == DTYPE and _rel(got, want) < TOLERANCE
    if n % 2 == 0:
        gate, up = F.linear(normed, w.float(), b.float()).chunk(2, dim=-1)
        silu = triton_gemv.gemv_silu_mul(x, folded, b, config, norm_eps=1e-6)
        assert silu.shape == (1, n // 2) and _rel(silu, F.silu(gate) * up) < TOLERANCE
    residual = torch.randn(1, n, generator=g).to(DEVICE, DTYPE)
    plain = triton_gemv.gemv(x, w, b, config)
    assert torch.equal(triton_gemv.gemv(x, w, b, config, residual=residual), plain + residual)
    with pytest.raises(ValueError, match="residual"):
        triton_gemv.gemv(x, w, b, config, residual=residual[:, :-1])


def test_one_row_configs_need_the_fold_and_a_gemv_pick_for_all_four_products(tiny_model_dir, monkeypatch):
    from onebit.models.loader import load_model

    model, _ = load_model(tiny_model_dir, torch.device(DEVICE), DTYPE)
    layer = model.layers[0]
    assert layer.one_row_configs() is None  # not folded
    assert model.fold_norms() == len(model.layers) and model.fold_norms() == 0  # once
    assert torch.equal(layer.input_layernorm.weight, torch.ones_like(layer.input_layernorm.weight))
    monkeypatch.setattr(gemv, "_CHOSEN", _gemv_picks(model))
    assert layer.one_row_configs() == ((8, 512, 4),) * 4 and model.one_row_configs() is not None
    gemv._CHOSEN.pop(next(iter(gemv._CHOSEN)))  # one product on cuBLAS: no one-row form
    assert layer.one_row_configs() is None and model.one_row_configs() is None


def _gemv_picks(model):
    picks = {}
    for p in (model.layers[0].self_attn.qkv_proj, model.layers[0].self_attn.o_proj, model.layers[0].mlp.gate_up_proj,
              model.layers[0].mlp.down_proj):
        w = p.weight
        picks[(w.device.type, 1, w.shape[0], w.shape[1], w.dtype, p.bias is not None)] = ("gemv", (8, 512, 4))
    return picks


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_a_folded_one_row_step_matches_the_plain_model(tiny_models, arch, monkeypatch):
    """A decode step of one row over a 5-token context: the folded model runs four gemv launches a layer and
    only the final norm (no add + RMSNorm kernels) and gives the plain model's hidden states, the cache
    writes included; at two rows it runs the usual path with unit norm weights and agrees as well."""
    from onebit.kernels.attention import AttentionMetadata
    from onebit.models.loader import load_model
    from onebit.models.rope import rope_cos_sin

    path = tiny_models(arch)
    device = torch.device(DEVICE)
    plain, cfg = load_model(path, device, DTYPE)
    folded, _ = load_model(path, device, DTYPE)
    folded.fold_norms()
    monkeypatch.setattr(gemv, "_CHOSEN", _gemv_picks(plain))
    norms = []
    real_norm = ops.add_rms_norm
    monkeypatch.setattr(ops, "add_rms_norm", lambda *a: norms.append(a[1] is not None) or real_norm(*a))
    rope = rope_cos_sin(cfg, 64, device)
    g = torch.Generator().manual_seed(3)
    shape = (2, cfg.num_layers, 4, 4, cfg.num_kv_heads, cfg.head_dim)
    cache = torch.randn(shape, generator=g).to(device, DTYPE)

    def step(model, rows):
        kv = cache.clone()
        meta = AttentionMetadata(
            slot_mapping=torch.tensor([4, 9][:rows], device=device), num_decodes=rows,
            decode_block_tables=torch.tensor([[0, 1], [2, 1]][:rows], dtype=torch.int32, device=device),
            decode_context_lens=torch.tensor([5, 6][:rows], dtype=torch.int32, device=device), prefills=[],
            decode_max_context=8)
        ids = torch.tensor([7, 11][:rows], device=device)
        with torch.no_grad():
            normed, prenorm = model(ids, torch.tensor([4, 5][:rows], device=device), kv, meta, rope, return_prenorm=True)
        return normed, prenorm, kv

    want = step(plain, 1)
    # the plain model: the first input norm without a residual, every later norm (the final one too) with one
    assert norms == [False] + [True] * (2 * cfg.num_layers)
    norms.clear()
    got = step(folded, 1)
    assert norms == [False]  # the final norm only
    for a, b in zip(got, want):
        assert _rel(a, b) < TOLERANCE
    assert _rel(step(folded, 2)[0], step(plain, 2)[0]) < TOLERANCE


def test_the_engine_folds_on_cuda_only_and_not_under_quantize(tiny_model_dir):
    """`build.fold_norms`: the loader's rule (CUDA, no --quantize, the switch on); the model is on the CPU
    here, which the rule does not look at."""
    from onebit.engine import build
    from onebit.engine.config import EngineConfig
    from onebit.models import transformer
    from onebit.models.loader import load_model

    assert transformer.FOLD_NORMS  # on since session 31
    config = EngineConfig(model=str(tiny_model_dir))
    model, _ = load_model(tiny_model_dir, torch.device("cpu"), torch.float32)
    assert build.fold_norms(model, config, torch.device("cpu")) == 0
    assert build.fold_norms(model, EngineConfig(model=str(tiny_model_dir), quantize="fp8"), torch.device("cuda")) == 0
    assert not model.layers[0].norms_folded
    assert build.fold_norms(model, config, torch.device("cuda")) == len(model.layers)
    assert all(layer.norms_folded for layer in model.layers)
