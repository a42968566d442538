"""Write a model directory with a real model's shape but no weights, for `--load-format dummy` runs.

    python3 bench/make_shape_model.py DIR [--shape qwen3-8b]

The tokenizer is the tiny model's (byte-level BPE); prompts are random token ids anyway.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

SHAPES = {
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
}


def make_shape_model(out: Path, shape: str = "qwen3-8b") -> Path:
    """Write config.json for `shape` plus the tiny model's tokenizer files into `out`."""
    from onebit.models.tiny import make_tiny_model
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_tiny_model(Path(tmp) / "tiny", arch="qwen3", vocab=1024)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(tiny / name, out / name)
    (out / "config.json").write_text(json.dumps(SHAPES[shape], indent=1))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    args = ap.parse_args()
    print(make_shape_model(args.out, args.shape))
