"""Our transformer against transformers' implementation of the same architecture on the same weights."""

from __future__ import annotations

import pytest
import torch

from onebit import LLM, SamplingParams
from model_probe import all_logits

transformers = pytest.importorskip("transformers")

CASES = [
    ("qwen3", {}),                                   # GQA 4:2, q/k norm, tied embeddings
    ("qwen3", {"tie_word_embeddings": False, "kv_heads": 4}),
    ("llama", {}),                                   # untied, GQA
    ("llama", {"kv_heads": 1, "tie_word_embeddings": True}),
    ("qwen2", {}),                                   # QKV bias
    ("mistral", {}),
]


def _reference(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch,options", CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_logits_match_transformers(tiny_models, arch, options):
    path = tiny_models(arch, **options)
    llm = LLM(str(path), device="cpu", parallel=2)
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. def f(x): return x * 2")
    ours = all_logits(llm, ids)
    with torch.no_grad():
        ref = _reference(path)(torch.tensor([ids])).logits[0]
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_64_tokens_match_transformers_generate(tiny_models, arch):
    path = tiny_models(arch)
    llm = LLM(str(path), device="cpu", parallel=2, block_size=8)
    ids = llm.tokenizer.encode("Once upon a time, in a land far away,")
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0]
    with torch.no_grad():
        ref = _reference(path).generate(torch.tensor([ids]), max_new_tokens=64, min_new_tokens=64,
                                        do_sample=False, eos_token_id=None, pad_token_id=0)
    assert len(out.token_ids) == 64
    assert out.token_ids == ref[0, len(ids):].tolist()
    assert out.finish_reason == "length"


def test_llama3_rope_scaling_matches_transformers(tmp_path, tiny_models):
    import json
    import shutil
    src = tiny_models("llama")
    dst = tmp_path / "llama3"
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    (dst / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(dst), device="cpu", parallel=1)
    ids = list(range(5, 205))  # long enough that scaled and unscaled frequencies differ
    ours = all_logits(llm, ids)
    with torch.no_grad():
        ref = _reference(dst)(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4
