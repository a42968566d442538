"""Load a GGUF model: its config from the metadata, its weights dequantized onto the device."""

from __future__ import annotations

from pathlib import Path

import torch

from onebit.models.config import ModelConfig
from onebit.models.gguf.files import open_gguf
from onebit.models.gguf.metadata import config_from_gguf
from onebit.models.gguf.weights import base_rename, fill_from_gguf
from onebit.models.transformer import CausalLM


def load_gguf_model(path: Path, device: torch.device, dtype: torch.dtype,
                    load_format: str = "auto") -> tuple[CausalLM, ModelConfig]:
    """The model in the GGUF file `path` (its first shard when split) on `device` in `dtype`.

    load_format "dummy" reads only the metadata and draws random weights, as for a directory.
    """
    from onebit.models.loader import build_on_device, fill_random

    gfile = open_gguf(path)
    cfg = config_from_gguf(gfile)
    model = build_on_device(lambda: CausalLM(cfg), device, dtype)
    if load_format == "dummy":
        fill_random(model, seed=0)
    else:
        fill_from_gguf(model, gfile, cfg, base_rename(cfg), device, dtype, "weights")
    return model.eval(), cfg


def gguf_info(path: Path) -> dict:
    """What /props and /v1/models say about a GGUF model: file name, quantization type, architecture."""
    gfile = open_gguf(path)
    return {"format": "gguf", "file": gfile.path.name, "quantization": gfile.quantization,
            "architecture": gfile.architecture, "shards": len(gfile.shards)}
