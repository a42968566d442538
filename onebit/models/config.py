"""Model hyper-parameters read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from onebit.models.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}


@dataclass
class ModelConfig:
    """The decoder-only transformer shape shared by Qwen3, Qwen2, Llama and Mistral."""

    architecture: str
    family: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    torch_dtype: str | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_dir(cls, path: Path) -> "ModelConfig":
        """Read and check `config.json`; raise ModelLoadError naming what is wrong."""
        file = Path(path) / "config.json"
        try:
            raw = json.loads(file.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"{file.name} not found in {path}: not a Hugging Face model directory") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read {file.name}: {exc}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        """Build from the parsed JSON of `config.json`."""
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            raise ModelLoadError(f"unsupported architecture {archs or '(none given)'}; supported: {supported}")
        family = SUPPORTED_ARCHITECTURES[arch]
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            rope = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
            rope_theta = float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0)
            rope_type = rope.get("rope_type") or rope.get("type") or "default"
            eos = raw.get("eos_token_id")
            cfg = cls(
                architecture=arch,
                family=family,
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                vocab_size=int(raw["vocab_size"]),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
                max_position_embeddings=int(raw.get("max_position_embeddings") or 4096),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=True if family == "qwen2" else bool(raw.get("attention_bias", False)),
                o_bias=bool(raw.get("attention_bias", False)) if family in ("llama", "mistral") else False,
                mlp_bias=bool(raw.get("mlp_bias", False)),
                qk_norm=family == "qwen3",
                torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
                eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks the required field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"config.json has a malformed field: {exc}") from None
        if cfg.num_heads % cfg.num_kv_heads:
            raise ModelLoadError("num_attention_heads must be a multiple of num_key_value_heads")
        if cfg.rope_scaling and cfg.rope_scaling["rope_type"] not in ("llama3", "yarn", "linear"):
            raise ModelLoadError(f"unsupported rope_scaling type {cfg.rope_scaling['rope_type']!r}")
        return cfg
