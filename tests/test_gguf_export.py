"""The GGUF writer: tensors, metadata and tokenizer read back with gguf's own reader.

The live check (llama.cpp loads the file and continues greedily like our engine) is in
bench/peers/run_peers.py, since it needs a llama-server build.
"""

from __future__ import annotations

import json
import re

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from onebit.models.config import ModelConfig
from onebit.testing.gguf_export import (
    GGUFExportError, expected_tensors, export_gguf, main, rotate_half_to_interleaved,
)
from onebit.testing.tiny import make_tiny_model
from onebit.models.tokenizer import Tokenizer

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {arch: make_tiny_model(root / arch, arch=arch, layers=2, hidden=64, heads=4, kv_heads=2, vocab=512)
            for arch in ("qwen3", "llama", "qwen2", "mistral")}


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.get_field(key)
    assert field is not None, f"{key} missing"
    return field.contents()


def _tensors(reader: gguf.GGUFReader) -> dict:
    return {t.name: t for t in reader.tensors}


@pytest.mark.parametrize("arch, gguf_arch", [("qwen3", "qwen3"), ("llama", "llama"), ("qwen2", "qwen2"),
                                             ("mistral", "llama")])
def test_tensors_and_metadata(models, tmp_path, arch, gguf_arch):
    out = export_gguf(models[arch], tmp_path / "m.gguf", "f16")
    reader = gguf.GGUFReader(out)
    cfg = ModelConfig.from_dir(models[arch])
    tensors = _tensors(reader)

    expected = expected_tensors(cfg)
    assert set(tensors) == set(expected)
    assert ("output.weight" in tensors) == (not cfg.tie_word_embeddings)
    assert any(name.endswith("attn_q_norm.weight") for name in tensors) == (arch == "qwen3")
    assert any(name.endswith("attn_q.bias") for name in tensors) == (arch == "qwen2")
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[gguf_arch.upper()]]}
    for name, shape in expected.items():
        t = tensors[name]
        # GGUF lists dimensions fastest-first, the reverse of PyTorch's order.
        assert tuple(int(n) for n in t.shape) == tuple(reversed(shape)), name
        assert t.tensor_type == (Q.F16 if len(shape) == 2 else Q.F32), name
        assert re.sub(r"^blk\.\d+\.", "blk.{bid}.", name.rsplit(".", 1)[0]) in known, name

    assert _field(reader, "general.architecture") == gguf_arch
    assert _field(reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    a = gguf_arch
    assert _field(reader, f"{a}.block_count") == cfg.num_layers
    assert _field(reader, f"{a}.embedding_length") == cfg.hidden_size
    assert _field(reader, f"{a}.feed_forward_length") == cfg.intermediate_size
    assert _field(reader, f"{a}.attention.head_count") == cfg.num_heads
    assert _field(reader, f"{a}.attention.head_count_kv") == cfg.num_kv_heads
    assert _field(reader, f"{a}.attention.key_length") == cfg.head_dim
    assert _field(reader, f"{a}.rope.dimension_count") == cfg.head_dim
    assert _field(reader, f"{a}.context_length") == cfg.max_position_embeddings
    assert _field(reader, f"{a}.rope.freq_base") == pytest.approx(cfg.rope_theta)
    assert _field(reader, f"{a}.attention.layer_norm_rms_epsilon") == pytest.approx(cfg.rms_norm_eps)
    assert _field(reader, f"{a}.vocab_size") == cfg.vocab_size


def test_tokenizer_metadata(models, tmp_path):
    out = export_gguf(models["qwen3"], tmp_path / "m.gguf")
    reader = gguf.GGUFReader(out)
    tok = Tokenizer.from_dir(models["qwen3"])
    tok_json = json.loads((models["qwen3"] / "tokenizer.json").read_text())
    added = {t["id"]: t for t in tok_json["added_tokens"]}

    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "gpt-2"  # ByteLevel pre-tokenizer with GPT-2's regex
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert len(tokens) == tok.vocab_size == 512
    assert tokens == [added[i]["content"] if i in added else tok.id_to_token(i) for i in range(512)]
    types = _field(reader, "tokenizer.ggml.token_type")
    for i in range(512):
        want = (gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED) if i in added \
            else gguf.TokenType.NORMAL
        assert types[i] == want, (i, tokens[i])
    assert types[tok.token_to_id("<think>")] == gguf.TokenType.USER_DEFINED
    merges = tok_json["model"]["merges"]
    assert _field(reader, "tokenizer.ggml.merges") == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert _field(reader, "tokenizer.ggml.eos_token_id") == tok.token_to_id("<|im_end|>")
    assert _field(reader, "tokenizer.ggml.bos_token_id") == tok.token_to_id("<|endoftext|>")
    assert _field(reader, "tokenizer.ggml.padding_token_id") == tok.token_to_id("<|endoftext|>")
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False
    assert _field(reader, "tokenizer.chat_template") == tok.chat_template


def test_f32_data_round_trips(models, tmp_path):
    src = load_file(models["qwen3"] / "model.safetensors")
    tensors = _tensors(gguf.GGUFReader(export_gguf(models["qwen3"], tmp_path / "m.gguf", "f32")))
    for hf, name in [("model.embed_tokens.weight", "token_embd.weight"),
                     ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight"),
                     ("model.layers.1.self_attn.k_norm.weight", "blk.1.attn_k_norm.weight"),
                     ("model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"),
                     ("model.norm.weight", "output_norm.weight")]:
        assert tensors[name].tensor_type == Q.F32
        np.testing.assert_array_equal(np.asarray(tensors[name].data), src[hf].numpy(), err_msg=name)


def test_bf16_and_f16_data(models, tmp_path):
    src = load_file(models["qwen2"] / "model.safetensors")
    w = src["model.layers.0.mlp.up_proj.weight"]
    bf16 = _tensors(gguf.GGUFReader(export_gguf(models["qwen2"], tmp_path / "b.gguf", "bf16")))
    t = bf16["blk.0.ffn_up.weight"]
    assert t.tensor_type == Q.BF16
    bits = np.asarray(t.data).view(np.uint16).reshape(w.shape)
    np.testing.assert_array_equal(bits, w.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(np.asarray(bf16["blk.0.attn_q.bias"].data),
                                  src["model.layers.0.self_attn.q_proj.bias"].numpy())

    f16 = _tensors(gguf.GGUFReader(export_gguf(models["qwen2"], tmp_path / "h.gguf", "f16")))
    np.testing.assert_array_equal(np.asarray(f16["blk.0.ffn_up.weight"].data), w.half().numpy())


def _rope_rotate_half(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.cat([pos * inv, pos * inv])
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()


def _rope_interleaved(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = (pos * inv).cos(), (pos * inv).sin()
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)


def test_llama_qk_permutation_preserves_attention_scores(models, tmp_path):
    """llama.cpp's LLAMA graph rotates adjacent pairs; scores from the permuted Q/K under that rope
    must equal the scores of the original Q/K under Hugging Face's rotate-half rope."""
    cfg = ModelConfig.from_dir(models["llama"])
    src = load_file(models["llama"] / "model.safetensors")
    tensors = _tensors(gguf.GGUFReader(export_gguf(models["llama"], tmp_path / "m.gguf", "f32")))
    wq, wk = src["model.layers.1.self_attn.q_proj.weight"], src["model.layers.1.self_attn.k_proj.weight"]
    gq, gk = (torch.from_numpy(np.array(tensors[f"blk.1.attn_{n}.weight"].data)) for n in "qk")
    np.testing.assert_array_equal(gq.numpy(), rotate_half_to_interleaved(wq, cfg.num_heads).numpy())
    assert not torch.equal(gq, wq)

    x, y = torch.randn(cfg.hidden_size, dtype=torch.float64), torch.randn(cfg.hidden_size, dtype=torch.float64)
    d, group = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
    for h in range(cfg.num_heads):
        rows_q, rows_k = slice(h * d, (h + 1) * d), slice(h // group * d, (h // group + 1) * d)
        hf = _rope_rotate_half(wq[rows_q].double() @ x, 7, cfg.rope_theta) @ \
            _rope_rotate_half(wk[rows_k].double() @ y, 3, cfg.rope_theta)
        ours = _rope_interleaved(gq[rows_q].double() @ x, 7, cfg.rope_theta) @ \
            _rope_interleaved(gk[rows_k].double() @ y, 3, cfg.rope_theta)
        assert ours.item() == pytest.approx(hf.item(), rel=1e-9, abs=1e-9)


def test_qwen_weights_are_not_permuted(models, tmp_path):
    src = load_file(models["qwen2"] / "model.safetensors")
    tensors = _tensors(gguf.GGUFReader(export_gguf(models["qwen2"], tmp_path / "m.gguf", "f32")))
    np.testing.assert_array_equal(np.asarray(tensors["blk.0.attn_k.weight"].data),
                                  src["model.layers.0.self_attn.k_proj.weight"].numpy())


def test_cli_and_refusals(models, tmp_path, capsys):
    assert main([str(models["mistral"]), str(tmp_path / "m.gguf"), "--dtype", "bf16"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "m.gguf")
    assert not list(tmp_path.glob(".*.tmp"))

    bad = tmp_path / "bad"
    bad.mkdir()
    for f in models["qwen3"].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tok = json.loads((bad / "tokenizer.json").read_text())
    tok["decoder"] = {"type": "Metaspace", "replacement": "_"}
    (bad / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(GGUFExportError, match="byte-level BPE"):
        export_gguf(bad, tmp_path / "bad.gguf")
    assert main([str(bad), str(tmp_path / "bad.gguf")]) == 1
    assert "byte-level BPE" in capsys.readouterr().err
    assert not (tmp_path / "bad.gguf").exists()


def test_q4_k_m_follows_the_recipe_and_reads_back_close(tmp_path):
    """q4_k_m: each matrix in the recipe's type (Q4_K, Q6_K for the head and the chosen attn_v /
    ffn_down; their fallbacks where rows are not 256-value super-blocks), norms in f32, values back
    within 4- and 6-bit rounding; our loader serves the file."""
    from onebit.testing.gguf_encode import q4_k_m_type

    model = make_tiny_model(tmp_path / "m", arch="qwen3", layers=8, hidden=256, heads=4, kv_heads=2, vocab=512,
                            intermediate=512)
    src = load_file(model / "model.safetensors")
    cfg = ModelConfig.from_dir(model)
    reader = gguf.GGUFReader(export_gguf(model, tmp_path / "q.gguf", "q4_k_m"))
    assert _field(reader, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    tensors = _tensors(reader)
    kinds = {}
    for name, t in tensors.items():
        if len(t.shape) == 1:
            assert t.tensor_type == Q.F32, name
            continue
        rows_cols = tuple(int(v) for v in reversed(t.shape))
        want = q4_k_m_type(name, rows_cols[1], cfg.num_layers, cfg.tie_word_embeddings)
        assert t.tensor_type == Q[want], name
        kinds.setdefault(want, []).append(name)
    assert set(kinds) == {"Q4_K", "Q6_K"}
    assert {"token_embd.weight", "blk.0.ffn_down.weight", "blk.3.ffn_down.weight"} <= set(kinds["Q6_K"])  # tied head
    assert {"blk.2.ffn_down.weight", "blk.0.attn_q.weight"} <= set(kinds["Q4_K"])
    for hf, name in [("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight"),
                     ("model.layers.3.mlp.up_proj.weight", "blk.3.ffn_up.weight")]:
        t = tensors[name]
        got = torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(src[hf].shape))
        err = ((got - src[hf].float()).norm() / src[hf].float().norm()).item()
        assert err < (0.02 if t.tensor_type == Q.Q6_K else 0.12), (name, err)

    narrow = make_tiny_model(tmp_path / "n", arch="qwen3", layers=2, hidden=64, heads=4, kv_heads=2, vocab=512)
    fallback = _tensors(gguf.GGUFReader(export_gguf(narrow, tmp_path / "n.gguf", "q4_k_m")))
    assert fallback["blk.0.attn_q.weight"].tensor_type == Q.Q5_0  # 64 values a row: no K-quant super-block
    assert fallback["token_embd.weight"].tensor_type == Q.Q8_0  # the tied head's Q6_K, then its fallback

    from onebit import LLM, SamplingParams

    out = LLM(str(tmp_path / "q.gguf"), device="cpu", parallel=1).generate(
        [[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
