"""GGUF loading in the engine: config and weights from the file, dequantization error per type, MTP heads.

Files come from tests/gguf_files.py (the `gguf` library's writer), not from the engine's code.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from onebit import LLM
from onebit.models.config import ModelConfig
from onebit.models.gguf.files import open_gguf
from onebit.models.gguf.metadata import config_from_gguf
from onebit.models.gguf.weights import dequantize_rows, unpermute_rows
from onebit.models.loader import load_model
from onebit.models.mtp import load_mtp_head
from tests.gguf_files import Q, permute_qk, write_gguf
from tests.model_probe import all_logits

CPU = torch.device("cpu")
PROMPT = list(range(3, 40, 2))
# Stated error bound per type: root-mean-square of (logits - logits of the F32 file) over 19
# positions x 512 tokens, on the hidden-256 model whose logits have std ~1. Measured on CPU:
# F16 0.0009, BF16 0.007, Q8_0 0.021, Q6_K 0.088, Q5_1 0.16, Q5_0 0.18, Q4_1 0.31, Q4_K 0.32,
# Q4_0 0.34 (random weights have no structure to absorb rounding; the test's Q4_K/Q6_K encoder
# rounds to nearest without llama.cpp's scale search). A broken decoder gives ~1.4 (sqrt 2 x std).
LOGIT_RMS_BOUND = {Q.F16: 0.003, Q.BF16: 0.02, Q.Q8_0: 0.05, Q.Q6_K: 0.2, Q.Q5_0: 0.4, Q.Q5_1: 0.4,
                   Q.Q4_0: 0.7, Q.Q4_1: 0.7, Q.Q4_K: 0.7}


@pytest.fixture(scope="module")
def wide_model(tiny_models):
    """A tiny Qwen3 whose rows are multiples of 256, so every K-quant applies to every matrix."""
    return tiny_models("qwen3", hidden=256, heads=4, kv_heads=2, intermediate=512)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama", "mistral"])
def test_f32_file_gives_the_same_config_and_weights(arch, tiny_models, tmp_path):
    src = tiny_models(arch)
    path = write_gguf(src, tmp_path / f"{arch}.gguf")
    ours, cfg = load_model(path, CPU, torch.float32)
    ref, ref_cfg = load_model(src, CPU, torch.float32)
    skip = {"architecture", "family", "torch_dtype", "eos_token_ids"}  # mistral is written as llama
    assert {k: v for k, v in dataclasses.asdict(cfg).items() if k not in skip} == \
        {k: v for k, v in dataclasses.asdict(ref_cfg).items() if k not in skip}
    assert set(ref_cfg.eos_token_ids) <= set(cfg.eos_token_ids)
    theirs = ref.state_dict()
    for name, value in ours.state_dict().items():
        assert torch.equal(value, theirs[name]), name  # llama: Q/K permutation undone exactly


def test_unpermute_inverts_llama_cpp_permutation():
    w = torch.randn(4 * 16, 8)
    assert torch.equal(unpermute_rows(permute_qk(w, 4), 16), w)
    assert not torch.equal(permute_qk(w, 4), w)


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q6_K])
def test_quantized_file_logits_stay_near_f32(qtype, wide_model, tmp_path):
    f32 = LLM(str(write_gguf(wide_model, tmp_path / "f32.gguf")), device="cpu", parallel=1)
    quant_path = write_gguf(wide_model, tmp_path / f"{qtype.name}.gguf", qtype)
    gfile = open_gguf(quant_path)
    assert gfile.tensors["blk.0.ffn_down.weight"].tensor_type == qtype
    assert gfile.tensors["token_embd.weight"].tensor_type == qtype
    quant = LLM(str(quant_path), device="cpu", parallel=1)
    ref, got = all_logits(f32, PROMPT), all_logits(quant, PROMPT)
    error = (got - ref).pow(2).mean().sqrt().item()
    assert 0 < error < LOGIT_RMS_BOUND[qtype], error  # never exactly equal: the file really is quantized
    assert ref.std().item() > 0.5


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_K])
def test_dequantize_rows_equals_the_library_on_any_row_range(qtype, wide_model, tmp_path):
    gfile = open_gguf(write_gguf(wide_model, tmp_path / "m.gguf", qtype))
    tensor = gfile.tensors["blk.1.ffn_up.weight"]
    whole = gguf.quants.dequantize(np.asarray(tensor.data), qtype) if qtype != Q.F16 else \
        np.asarray(tensor.data).astype(np.float32)
    part = dequantize_rows(gfile, "blk.1.ffn_up.weight", 5, 77, CPU).float().numpy()
    assert np.array_equal(part, whole[5:77])


def test_metadata_rope_and_eps(tiny_models, tmp_path):
    path = write_gguf(tiny_models("llama"), tmp_path / "m.gguf")
    cfg = config_from_gguf(open_gguf(path))
    assert isinstance(cfg, ModelConfig) and cfg.rope_theta == 10000.0 and cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings is False and cfg.rope_scaling is None


def test_mtp_head_from_gguf_equals_the_safetensors_head(tiny_models, tmp_path):
    src = tiny_models("qwen3", mtp=True)
    model_file = write_gguf(src, tmp_path / "model.gguf")
    head_file = write_gguf(src, tmp_path / "head.gguf", mtp_only=True)
    _, cfg = load_model(model_file, CPU, torch.float32)
    ours = load_mtp_head(model_file, cfg, CPU, torch.float32, head_file)
    ref = load_mtp_head(src, cfg, CPU, torch.float32)
    theirs = ref.state_dict()
    assert set(ours.state_dict()) == set(theirs)
    for name, value in ours.state_dict().items():
        assert torch.equal(value, theirs[name]), name


def test_mtp_from_a_file_without_a_nextn_block_says_what_is_supported(tiny_models, tmp_path):
    from onebit.models.errors import ModelLoadError

    model_file = write_gguf(tiny_models("qwen3"), tmp_path / "model.gguf")
    _, cfg = load_model(model_file, CPU, torch.float32)
    with pytest.raises(ModelLoadError, match="nextn layout"):
        load_mtp_head(model_file, cfg, CPU, torch.float32, model_file)
