"""A GGUF file's key/values -> the same ModelConfig the safetensors path builds from config.json."""

from __future__ import annotations

from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.gguf.files import GGUFFile

# GGUF architecture -> (our config's architecture, family). llama.cpp writes Mistral dense models as llama.
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}


def check_architecture(gfile: GGUFFile) -> str:
    """The file's architecture when supported; ModelLoadError naming it and the supported ones otherwise."""
    arch = gfile.architecture
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{gfile.path.name}: unsupported GGUF architecture {arch!r}; "
                             f"supported: {', '.join(sorted(ARCHITECTURES))}")
    return arch


def _required(gfile: GGUFFile, key: str) -> int:
    value = gfile.get(key)
    if value is None:
        raise ModelLoadError(f"{gfile.path.name}: metadata lacks the required key {key!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ModelLoadError(f"{gfile.path.name}: metadata {key!r} is not a number: {value!r}") from None


def _rope_scaling(gfile: GGUFFile, arch: str, context: int) -> dict | None:
    """Our rope_scaling dict from `{arch}.rope.scaling.*` or a `rope_freqs` tensor (llama3-style)."""
    freqs = gfile.tensors.get("rope_freqs.weight")
    if freqs is not None:  # llama.cpp divides each rotary frequency by its factor (Llama 3 scaling)
        if freqs.tensor_type.name != "F32":
            raise ModelLoadError(f"{gfile.path.name}: rope_freqs.weight must be F32, not {freqs.tensor_type.name}")
        return {"rope_type": "freq_factors", "factors": [float(x) for x in freqs.data.reshape(-1)]}
    kind = gfile.get(f"{arch}.rope.scaling.type", "none")
    if kind in ("none", None):
        return None
    factor = float(gfile.get(f"{arch}.rope.scaling.factor", 1.0))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": factor,
               "original_max_position_embeddings": int(gfile.get(f"{arch}.rope.scaling.original_context_length")
                                                       or context)}
        for ours, key in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow"),
                          ("attention_factor", "attn_factor")):
            value = gfile.get(f"{arch}.rope.scaling.{key}")
            if value is not None:
                out[ours] = float(value)
        return out
    raise ModelLoadError(f"{gfile.path.name}: unsupported rope scaling type {kind!r}; supported: none, linear, yarn, "
                         "and llama3-style frequency factors (a rope_freqs tensor)")


def _f32(value) -> float:
    """A float32 from the file as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07)."""
    import numpy as np

    return float(repr(np.float32(value)).removeprefix("np.float32(").removesuffix(")"))


def _eos_ids(gfile: GGUFFile) -> list[int]:
    ids = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = gfile.get(key)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids


def config_from_gguf(gfile: GGUFFile) -> ModelConfig:
    """Hyper-parameters, RoPE, norm epsilon and tied embeddings of a GGUF model, as a ModelConfig."""
    arch = check_architecture(gfile)
    architecture, family = ARCHITECTURES[arch]
    p = f"{arch}."
    hidden = _required(gfile, p + "embedding_length")
    heads = _required(gfile, p + "attention.head_count")
    kv_heads = int(gfile.get(p + "attention.head_count_kv") or heads)
    head_dim = int(gfile.get(p + "attention.key_length") or hidden // heads)
    rope_dim = int(gfile.get(p + "rope.dimension_count") or head_dim)
    if rope_dim != head_dim:
        raise ModelLoadError(f"{gfile.path.name}: partial rotary embeddings (rope.dimension_count {rope_dim} < "
                             f"head dim {head_dim}) are not supported")
    embed = gfile.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelLoadError(f"{gfile.path.name}: missing tensor token_embd.weight")
    context = int(gfile.get(p + "context_length") or 4096)
    cfg = ModelConfig(
        architecture=architecture,
        family=family,
        hidden_size=hidden,
        intermediate_size=_required(gfile, p + "feed_forward_length"),
        num_layers=_required(gfile, p + "block_count") - int(gfile.get(p + "nextn_predict_layers") or 0),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=int(embed.shape[1]),  # GGUF shapes list the fastest dimension first
        rms_norm_eps=_f32(gfile.get(p + "attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(gfile.get(p + "rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(gfile, arch, context),
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in gfile.tensors,
        qkv_bias=family == "qwen2" or "blk.0.attn_q.bias" in gfile.tensors,
        o_bias="blk.0.attn_output.bias" in gfile.tensors,
        mlp_bias="blk.0.ffn_gate.bias" in gfile.tensors,
        qk_norm=family == "qwen3",
        torch_dtype=None,
        eos_token_ids=_eos_ids(gfile),
    )
    if cfg.num_heads % cfg.num_kv_heads:
        raise ModelLoadError(f"{gfile.path.name}: head_count must be a multiple of head_count_kv")
    return cfg
