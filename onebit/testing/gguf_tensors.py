"""The tensor half of a GGUF file: Hugging Face tensor names to llama.cpp's, the rotary row
order llama.cpp's LLAMA graph expects, and the plan of what to write (checked against config.json)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import torch
from safetensors import safe_open

from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.loader import weight_files
from onebit.models.rope import llama3_inv_freq

__all__ = ["GGUFExportError", "GGUF_ARCH", "TensorPlan", "expected_tensors", "gguf_tensor_name", "plan_tensors",
           "rotate_half_to_interleaved"]

# Our model family -> llama.cpp architecture. llama.cpp has no separate dense "mistral" graph:
# a Hugging Face Mistral is a Llama with (optionally) a sliding window.
GGUF_ARCH = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama", "mistral": "llama"}

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
class TensorPlan:
    """One output tensor: where it comes from and how it is transformed."""

    name: str
    shape: tuple[int, ...]
    qtype: gguf.GGMLQuantizationType
    load: Callable[[], torch.Tensor] = field(repr=False)


def _order(name: str) -> tuple:
    """token_embd first, then blocks in order, then output_norm and output (as llama.cpp's files read)."""
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0 if name.startswith(("token_embd", "rope_freqs")) else 2, 0, name)


def plan_tensors(path: Path, cfg: ModelConfig, qtype: gguf.GGMLQuantizationType) -> list[TensorPlan]:
    """What to write for each tensor of the checkpoint in `path`, in llama.cpp's file order."""
    permute = GGUF_ARCH[cfg.family] == "llama"
    plans: dict[str, TensorPlan] = {}
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
                plans[name] = TensorPlan(name, shape, qtype if len(shape) > 1 else gguf.GGMLQuantizationType.F32, load)
    s = cfg.rope_scaling
    if s is not None and s["rope_type"] == "llama3":
        # llama.cpp's LLAMA graph divides each rotary frequency by the matching rope_freqs factor.
        base = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        factors = (base / llama3_inv_freq(base, s)).float()
        plans["rope_freqs.weight"] = TensorPlan("rope_freqs.weight", tuple(factors.shape),
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


def _check_complete(plans: dict[str, TensorPlan], cfg: ModelConfig) -> None:
    expected = expected_tensors(cfg)
    missing = sorted(set(expected) - set(plans))
    if missing:
        raise GGUFExportError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:3])}")
    for name, shape in expected.items():
        if plans[name].shape != shape:
            raise GGUFExportError(f"{name} has shape {plans[name].shape}, expected {shape} from config.json")
