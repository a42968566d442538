"""A GGUF writer for tests, built on the `gguf` library (independent of the engine's loader).

`write_gguf(model_dir, out, qtype)` writes a tiny Hugging Face model directory (onebit.testing.tiny)
as llama.cpp's converter would: llama.cpp tensor names, Q/K rows permuted for the `llama`
architecture, matrices in `qtype`, norms and biases in F32, the byte-level BPE vocabulary in the
`tokenizer.ggml.*` keys. Optional: split into shards, drop a tensor, or write only the MTP head
(`mtp.*` tensors) in llama.cpp's nextn layout.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

Q = gguf.GGMLQuantizationType
ARCH = {"Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama",
        "MistralForCausalLM": "llama"}
BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
NEXTN = {"pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "fc": "eh_proj",
         "norm": "shared_head_norm"}


def permute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's convert permutation of Q/K rows for the llama architecture (rotate-half -> interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str, num_layers: int, mtp_block: int) -> str | None:
    """llama.cpp's name for a Hugging Face tensor name (MTP tensors into block `mtp_block`)."""
    if hf in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}[hf]
    module, kind = hf.rsplit(".", 1)
    if module.startswith("model.layers."):
        block, rest = module[len("model.layers."):].split(".", 1)
        return f"blk.{block}.{BLOCK[rest]}.{kind}"
    if module.startswith("mtp.layers.0."):
        return f"blk.{mtp_block}.{BLOCK[module[len('mtp.layers.0.'):]]}.{kind}"
    if module.startswith("mtp."):
        return f"blk.{mtp_block}.nextn.{NEXTN[module[4:]]}.{kind}"
    return None


def encode(t: torch.Tensor, qtype: Q) -> tuple[np.ndarray, Q]:
    """The tensor in `qtype` (gguf.quants where it can), F32 for vectors and rows the block size does not divide."""
    data = t.float().contiguous().numpy()
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if data.ndim < 2 or data.shape[-1] % block or qtype == Q.F32:
        return data, Q.F32
    if qtype in (Q.Q4_K, Q.Q6_K):
        from tests.gguf_kquants import quantize_k
        return quantize_k(data, qtype), qtype
    return gguf.quants.quantize(data, qtype), qtype


def vocab_metadata(w: gguf.GGUFWriter, model_dir: Path, pre: str, add_bos: bool) -> None:
    """tokenizer.ggml.* from tokenizer.json (+ specials from tokenizer_config.json, template)."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = dict(tok["model"]["vocab"])
    types = {}
    for added in tok["added_tokens"]:
        vocab[added["content"]] = added["id"]
        types[added["id"]] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([int(types.get(i, gguf.TokenType.NORMAL)) for i in range(len(tokens))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(vocab[cfg["eos_token"]])
    w.add_bos_token_id(vocab["<|endoftext|>"])
    w.add_eot_token_id(vocab["<|endoftext|>"])
    w.add_add_bos_token(add_bos)
    w.add_chat_template(cfg["chat_template"])


def hyper_parameters(w: gguf.GGUFWriter, c: dict, file_type: int, extra_blocks: int = 0) -> None:
    """The model's shape under the `{arch}.*` keys, as llama.cpp writes them."""
    w.add_file_type(file_type)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"] + extra_blocks)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])


FILE_TYPES = {Q.F32: 0, Q.F16: 1, Q.Q8_0: 7, Q.Q4_K: 15, Q.Q6_K: 18, Q.BF16: 32, Q.Q4_0: 2, Q.Q5_0: 8}


def write_gguf(model_dir: Path, out: Path, qtype: Q = Q.F32, *, pre: str = "gpt-2", split_max_tensors: int = 0,
               drop: tuple[str, ...] = (), mtp_only: bool = False, add_bos: bool = False, types=None) -> Path:
    """Write `model_dir` as GGUF to `out` (with split_max_tensors, shards NAME-0000i-of-0000n.gguf beside it).

    types: optional `types(gguf name, tensor) -> Q` choosing each matrix's type (a mixed file such as Q4_K_M)."""
    c = json.loads((model_dir / "config.json").read_text())
    arch = ARCH[c["architectures"][0]]
    layers = c["num_hidden_layers"]
    tensors = load_file(str(model_dir / "model.safetensors"))
    w = gguf.GGUFWriter(out, arch, split_max_tensors=split_max_tensors)
    w.add_name(model_dir.name)
    hyper_parameters(w, c, FILE_TYPES.get(qtype, 1024), extra_blocks=1 if mtp_only else 0)
    if mtp_only:
        w.add_uint32(f"{arch}.nextn_predict_layers", 1)
    else:
        vocab_metadata(w, model_dir, pre, add_bos)
    for hf, t in tensors.items():
        if hf.startswith("mtp.") != mtp_only:
            continue
        name = gguf_name(hf, layers, mtp_block=layers)
        if name is None or name in drop:
            continue
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            t = permute_qk(t, c["num_attention_heads"] if ".attn_q." in name else c["num_key_value_heads"])
        data, kind = encode(t, types(name, t) if types else qtype)
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
