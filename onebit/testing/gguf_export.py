"""Write a Hugging Face model directory (Qwen3, Qwen2, Llama, Mistral) as one GGUF file for llama.cpp.

    python -m onebit.testing.gguf_export MODEL_DIR OUT.gguf [--dtype f32|f16|bf16]

Weights stream from the safetensors files one tensor at a time, so the whole model is never in
memory. Matrices are stored in the chosen dtype, norms and biases always in f32. The tokenizer
must be a byte-level BPE (`tokenizer.json`), as Qwen, Llama 3 and our tiny models use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import torch
from safetensors import safe_open

from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.loader import weight_files
from onebit.models.rope import llama3_inv_freq
from onebit.models.tokenizer import Tokenizer

__all__ = ["GGUFExportError", "GGUF_ARCH", "export_gguf", "gguf_tensor_name", "main"]

# Our model family -> llama.cpp architecture. llama.cpp has no separate dense "mistral" graph:
# a Hugging Face Mistral is a Llama with (optionally) a sliding window.
GGUF_ARCH = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama", "mistral": "llama"}

DTYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
}

# What _convert hands the writer for each stored type (bf16 travels as raw 16-bit patterns).
_NUMPY_DTYPE = {
    gguf.GGMLQuantizationType.F32: np.dtype(np.float32),
    gguf.GGMLQuantizationType.F16: np.dtype(np.float16),
    gguf.GGMLQuantizationType.BF16: np.dtype(np.uint16),
}

_LAYER_TENSORS = {  # HF name inside model.layers.N. -> GGUF name inside blk.N.
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL_TENSORS = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")

# tokenizer.json split regexes of known byte-level BPE tokenizers -> llama.cpp's `tokenizer.ggml.pre`.
_SPLIT_PRE = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",
}


class GGUFExportError(ModelLoadError):
    """The model directory cannot be written as GGUF (unsupported layout, tokenizer or tensor)."""


def gguf_tensor_name(hf_name: str, tie_word_embeddings: bool = False, num_layers: int | None = None) -> str | None:
    """The GGUF name of a checkpoint tensor, or None for tensors llama.cpp does not take
    (a tied lm_head, MTP heads or layers past `num_layers`, rotary caches)."""
    if hf_name == "lm_head.weight" and tie_word_embeddings:
        return None
    if m := _LAYER_RE.fullmatch(hf_name):
        block, module, kind = m.groups()
        if num_layers is not None and int(block) >= num_layers:
            return None
        name = _LAYER_TENSORS.get(module)
        return f"blk.{block}.{name}.{kind}" if name else None
    module, _, kind = hf_name.rpartition(".")
    name = _GLOBAL_TENSORS.get(module)
    return f"{name}.{kind}" if name and kind == "weight" else None


def rotate_half_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a Q or K projection (weight or bias) from Hugging Face's rotate-half
    rotary layout (pairs (i, i + d/2) of each head) to llama.cpp's LLAMA layout (pairs (2i, 2i+1))."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(rows, *w.shape[1:])


@dataclass
class _Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None


@dataclass
class _Plan:
    """One output tensor: where it comes from and how it is transformed."""

    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    load: Callable[[], torch.Tensor] = field(repr=False)


def _pre_tokenizer(pre: dict | None) -> str:
    """llama.cpp's pre-tokenizer name for a tokenizer.json `pre_tokenizer` section."""
    if not pre:
        raise GGUFExportError("tokenizer.json has no pre_tokenizer; cannot tell llama.cpp how to split text")
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    if pre.get("type") == "Sequence":
        splits = [p for p in pre.get("pretokenizers", []) if p.get("type") == "Split"]
        if len(splits) == 1:
            pattern = splits[0].get("pattern", {}).get("Regex")
            if pattern in _SPLIT_PRE:
                return _SPLIT_PRE[pattern]
    raise GGUFExportError(
        "unrecognised pre-tokenizer in tokenizer.json; pass --tokenizer-pre NAME with llama.cpp's name for it "
        f"(known here: gpt-2, {', '.join(sorted(set(_SPLIT_PRE.values())))})")


def _adds_bos(tok_json: dict, tok_config: dict, bos: str | None) -> bool:
    if isinstance(tok_config.get("add_bos_token"), bool):
        return tok_config["add_bos_token"]
    post = tok_json.get("post_processor") or {}
    steps = post.get("processors", []) if post.get("type") == "Sequence" else [post]
    for step in steps:
        if step.get("type") == "TemplateProcessing":
            first = (step.get("single") or [{}])[0]
            return "SpecialToken" in first and (bos is None or first["SpecialToken"]["id"] == bos)
    return False


def _read_vocab(path: Path, cfg: ModelConfig, pre_override: str | None) -> _Vocab:
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise GGUFExportError(f"tokenizer.json not found in {path}")
    tok_json = json.loads(tok_file.read_text(encoding="utf-8"))
    model = tok_json.get("model") or {}
    decoder = tok_json.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        raise GGUFExportError("only byte-level BPE tokenizers are supported (tokenizer.json model BPE with a "
                              f"ByteLevel decoder); this one is {model.get('type')} / {decoder.get('type')}")
    tok = Tokenizer.from_dir(path)
    tok_config_file = path / "tokenizer_config.json"
    tok_config = json.loads(tok_config_file.read_text(encoding="utf-8")) if tok_config_file.is_file() else {}

    size = max(cfg.vocab_size, tok.vocab_size)
    tokens: list[str | None] = [None] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    for text, i in model["vocab"].items():
        tokens[i] = text
    for added in tok_json.get("added_tokens", []):
        i = added["id"]
        tokens[i] = added["content"]
        # llama.cpp matches user-defined tokens in raw text and never shows control tokens.
        types[i] = int(gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED)
    for i, text in enumerate(tokens):
        if text is None:  # the model's embedding is larger than the tokenizer: padding rows
            tokens[i] = f"[PAD{i}]"
            types[i] = int(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    def token_id(value) -> int | None:
        value = value.get("content") if isinstance(value, dict) else value
        return tok.token_to_id(value) if isinstance(value, str) else None

    raw_config = json.loads((path / "config.json").read_text())
    eos_id = token_id(tok_config.get("eos_token"))
    if eos_id is None and cfg.eos_token_ids:
        eos_id = cfg.eos_token_ids[0]
    bos_id = token_id(tok_config.get("bos_token"))
    if bos_id is None and isinstance(raw_config.get("bos_token_id"), int):
        bos_id = raw_config["bos_token_id"]
    return _Vocab(
        tokens=tokens, types=types, merges=merges,
        pre=pre_override or _pre_tokenizer(tok_json.get("pre_tokenizer")),
        bos_id=bos_id, eos_id=eos_id, pad_id=token_id(tok_config.get("pad_token")),
        add_bos=_adds_bos(tok_json, tok_config, tok.bos_token),
        chat_template=tok.chat_template if tok.has_chat_template else None,
    )


def _write_metadata(w: gguf.GGUFWriter, cfg: ModelConfig, vocab: _Vocab, name: str,
                    ftype: gguf.LlamaFileType) -> None:
    w.add_name(name)
    w.add_file_type(int(ftype))
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(vocab.tokens))
    s = cfg.rope_scaling
    if s is not None and s["rope_type"] in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(s["rope_type"]))
        w.add_rope_scaling_factor(float(s["factor"]))
        if s["rope_type"] == "yarn":
            w.add_rope_scaling_orig_ctx_len(int(s.get("original_max_position_embeddings")
                                                or cfg.max_position_embeddings))
    # llama3 scaling is carried by the rope_freqs tensor instead (see _plan_tensors).

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    if vocab.bos_id is not None:
        w.add_bos_token_id(vocab.bos_id)
    if vocab.eos_id is not None:
        w.add_eos_token_id(vocab.eos_id)
    if vocab.pad_id is not None:
        w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(vocab.add_bos)
    w.add_add_eos_token(False)
    if vocab.chat_template is not None:
        w.add_chat_template(vocab.chat_template)


def _convert(t: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype == gguf.GGMLQuantizationType.F32:
        return t.to(torch.float32).contiguous().numpy()
    if qtype == gguf.GGMLQuantizationType.F16:
        return t.to(torch.float16).contiguous().numpy()
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def _order(name: str) -> tuple:
    """token_embd first, then blocks in order, then output_norm and output (as llama.cpp's files read)."""
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0 if name.startswith(("token_embd", "rope_freqs")) else 2, 0, name)


def _plan_tensors(path: Path, cfg: ModelConfig, qtype: gguf.GGMLQuantizationType) -> list[_Plan]:
    permute = GGUF_ARCH[cfg.family] == "llama"
    plans: dict[str, _Plan] = {}
    for file in weight_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for hf_name in handle.keys():
                name = gguf_tensor_name(hf_name, cfg.tie_word_embeddings, cfg.num_layers)
                if name is None:
                    continue
                if name in plans:
                    raise GGUFExportError(f"tensor {hf_name!r} appears twice in the checkpoint")
                shape = tuple(handle.get_slice(hf_name).get_shape())
                heads = (cfg.num_heads if ".attn_q." in name else cfg.num_kv_heads if ".attn_k." in name else 0)

                def load(file=file, hf_name=hf_name, heads=heads) -> torch.Tensor:
                    with safe_open(str(file), framework="pt", device="cpu") as h:
                        t = h.get_tensor(hf_name)
                    return rotate_half_to_interleaved(t, heads) if permute and heads else t

                # Norms and biases stay f32: they are tiny and llama.cpp computes them in f32 anyway.
                plans[name] = _Plan(name, shape, qtype if len(shape) > 1 else gguf.GGMLQuantizationType.F32, load)
    s = cfg.rope_scaling
    if s is not None and s["rope_type"] == "llama3":
        # llama.cpp's LLAMA graph divides each rotary frequency by the matching rope_freqs factor.
        base = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        factors = (base / llama3_inv_freq(base, s)).float()
        plans["rope_freqs.weight"] = _Plan("rope_freqs.weight", tuple(factors.shape),
                                           gguf.GGMLQuantizationType.F32, lambda f=factors: f)
    _check_complete(plans, cfg)
    return sorted(plans.values(), key=lambda p: _order(p.name))


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a GGUF of `cfg` must hold, with its shape in PyTorch (row-major) order."""
    q, kv, d = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size
    out = {"token_embd.weight": (cfg.vocab_size, d), "output_norm.weight": (d,)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.num_layers):
        b = f"blk.{i}."
        out.update({
            b + "attn_norm.weight": (d,), b + "attn_q.weight": (q, d), b + "attn_k.weight": (kv, d),
            b + "attn_v.weight": (kv, d), b + "attn_output.weight": (d, q), b + "ffn_norm.weight": (d,),
            b + "ffn_gate.weight": (cfg.intermediate_size, d), b + "ffn_up.weight": (cfg.intermediate_size, d),
            b + "ffn_down.weight": (d, cfg.intermediate_size),
        })
        if cfg.qkv_bias:
            out.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if cfg.o_bias:
            out[b + "attn_output.bias"] = (d,)
        if cfg.qk_norm:
            out.update({b + "attn_q_norm.weight": (cfg.head_dim,), b + "attn_k_norm.weight": (cfg.head_dim,)})
        if cfg.mlp_bias:
            out.update({b + "ffn_gate.bias": (cfg.intermediate_size,), b + "ffn_up.bias": (cfg.intermediate_size,),
                        b + "ffn_down.bias": (d,)})
    return out


def _check_complete(plans: dict[str, _Plan], cfg: ModelConfig) -> None:
    expected = expected_tensors(cfg)
    missing = sorted(set(expected) - set(plans))
    if missing:
        raise GGUFExportError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:3])}")
    for name, shape in expected.items():
        if plans[name].shape != shape:
            raise GGUFExportError(f"{name} has shape {plans[name].shape}, expected {shape} from config.json")


def export_gguf(model_dir: str | Path, out: str | Path, dtype: str = "f32",
                tokenizer_pre: str | None = None) -> Path:
    """Write `model_dir` (a Hugging Face directory) to the GGUF file `out` and return its path.

    The file appears only when complete (written beside it, then renamed).
    """
    path, out = Path(model_dir), Path(out)
    if dtype not in DTYPES:
        raise GGUFExportError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    cfg = ModelConfig.from_dir(path)
    if cfg.family == "qwen2" and cfg.head_dim * cfg.num_heads != cfg.hidden_size:
        raise GGUFExportError("llama.cpp's qwen2 graph needs head_dim * num_attention_heads == hidden_size")
    if cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3" and GGUF_ARCH[cfg.family] != "llama":
        raise GGUFExportError(f"llama3 rope scaling is only supported for Llama-family models, not {cfg.family}")
    qtype, ftype = DTYPES[dtype]
    vocab = _read_vocab(path, cfg, tokenizer_pre)
    if len(vocab.tokens) != cfg.vocab_size:
        raise GGUFExportError(f"tokenizer has {len(vocab.tokens)} tokens but config.json vocab_size is "
                              f"{cfg.vocab_size}; llama.cpp needs one entry per embedding row")
    plans = _plan_tensors(path, cfg, qtype)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, GGUF_ARCH[cfg.family])
    try:
        _write_metadata(writer, cfg, vocab, path.resolve().name, ftype)
        for p in plans:
            np_dtype = _NUMPY_DTYPE[p.qtype]
            writer.add_tensor_info(p.name, p.shape, np_dtype, int(np.prod(p.shape)) * np_dtype.itemsize,
                                   raw_dtype=p.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for p in plans:
            writer.write_tensor_data(_convert(p.load(), p.qtype))
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m onebit.testing.gguf_export", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="Hugging Face model directory (config.json, safetensors, tokenizer.json)")
    parser.add_argument("out", help="GGUF file to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="type of the matrices (default f32)")
    parser.add_argument("--tokenizer-pre", help="llama.cpp pre-tokenizer name, when it cannot be recognised")
    args = parser.parse_args(argv)
    try:
        out = export_gguf(args.model_dir, args.out, args.dtype, args.tokenizer_pre)
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
