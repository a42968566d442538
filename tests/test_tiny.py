"""The tiny model generator: deterministic bytes, exact vocab, loadable by transformers."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from onebit.testing import tiny
from onebit.testing.tiny import make_tiny_model
from onebit.models.tokenizer import Tokenizer

ARCHS = ["qwen3", "llama", "qwen2", "mistral"]


def _digests(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_generation_is_deterministic(tmp_path):
    a = make_tiny_model(tmp_path / "a", arch="qwen2", vocab=700)
    b = make_tiny_model(tmp_path / "b", arch="qwen2", vocab=700)
    digests = _digests(a)
    assert set(digests) == {"config.json", "generation_config.json", "model.safetensors",
                            "tokenizer.json", "tokenizer_config.json"}
    assert digests == _digests(b)
    c = _digests(make_tiny_model(tmp_path / "c", arch="qwen2", vocab=700, seed=1))
    assert c["model.safetensors"] != digests["model.safetensors"]
    assert c["tokenizer.json"] == digests["tokenizer.json"]


@pytest.mark.parametrize("vocab", [300, 512, 1024, 4000])
def test_vocab_size_matches_config(tmp_path, vocab):
    path = make_tiny_model(tmp_path, vocab=vocab, layers=1, hidden=32)
    config = json.loads((path / "config.json").read_text())
    tok = Tokenizer.from_dir(path)
    assert config["vocab_size"] == tok.vocab_size == vocab
    assert load_file(path / "model.safetensors")["model.embed_tokens.weight"].shape == (vocab, 32)
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]
    assert config["eos_token_id"] == tok.token_to_id("<|im_end|>")


def test_too_small_vocab_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vocab"):
        make_tiny_model(tmp_path, vocab=200)


def test_parameter_names(tmp_path):
    names = {arch: set(load_file(make_tiny_model(tmp_path / arch, arch=arch, layers=1) / "model.safetensors"))
             for arch in ARCHS}
    common = {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.mlp.down_proj.weight",
              "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight"}
    assert all(common <= n for n in names.values())
    assert "model.layers.0.self_attn.q_norm.weight" in names["qwen3"]
    assert not any("q_norm" in n for n in names["llama"] | names["qwen2"])
    assert "model.layers.0.self_attn.v_proj.bias" in names["qwen2"]
    assert not any(n.endswith(".bias") for n in names["qwen3"] | names["llama"] | names["mistral"])
    assert "lm_head.weight" not in names["qwen3"] and "lm_head.weight" in names["llama"]


@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_loads_each_arch(tiny_models, arch):
    transformers = pytest.importorskip("transformers")
    path = tiny_models(arch)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert type(model).__name__ == json.loads((path / "config.json").read_text())["architectures"][0]
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state = model.state_dict()
    for name, tensor in load_file(path / "model.safetensors").items():
        assert torch.equal(state[name], tensor), name
    reference_tok = transformers.AutoTokenizer.from_pretrained(path)
    ids = reference_tok("The quick brown fox", return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == Tokenizer.from_dir(path).encode("The quick brown fox")
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], 512)
    assert torch.isfinite(logits).all()
    assert logits[0, -1].std() > 0.3  # not flat: sampling tests can tell tokens apart


def test_cli_writes_model(tmp_path, capsys):
    tiny.main([str(tmp_path / "m"), "--arch", "llama", "--layers", "1", "--hidden", "32", "--heads", "2",
               "--kv-heads", "1", "--vocab", "400", "--tie"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (1, 32, 1)
    assert config["head_dim"] == 16 and config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(tmp_path / "m" / "model.safetensors")


