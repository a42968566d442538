"""Load a GGUF model: its config from the metadata, its weights dequantized onto the device or kept packed."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from onebit.models.config import ModelConfig
from onebit.models.gguf.files import open_gguf
from onebit.models.gguf.metadata import config_from_gguf
from onebit.models.gguf.weights import base_rename, fill_from_gguf
from onebit.models.transformer import CausalLM

log = logging.getLogger("onebit.models")


def load_gguf_model(path: Path, device: torch.device, dtype: torch.dtype, load_format: str = "auto",
                    keep_packed: bool | None = None) -> tuple[CausalLM, ModelConfig]:
    """The model in the GGUF file `path` (its first shard when split) on `device` in `dtype`.

    load_format "dummy" reads only the metadata and draws random weights, as for a directory.
    keep_packed: linear layers of Q8_0/Q4_K/Q5_K/Q6_K stay in their blocks on the device
    (`onebit.models.gguf.packed`); None or False: dequantized at load. Packed is opt-in until its
    kernels beat bf16: on the H200 the Q4_K kernel read 0.40 TB/s (2.5x slower than bf16 cuBLAS).
    """
    from onebit.models.gguf import packed
    from onebit.models.gguf.packed import fill_packed, plan_packed, skipping_packed, swap_in_packed
    from onebit.models.loader import build_on_device, fill_random

    gfile = open_gguf(path)
    cfg = config_from_gguf(gfile)
    rename = base_rename(cfg)
    keep_packed = bool(keep_packed)
    plans = {}

    def build() -> CausalLM:
        nonlocal plans
        model = CausalLM(cfg)
        if keep_packed and load_format != "dummy":
            plans = plan_packed(model, gfile, cfg, rename)
            swap_in_packed(model, plans)
        return model

    model = build_on_device(build, device, dtype)
    if load_format == "dummy":
        fill_random(model, seed=0)
    else:
        fill_from_gguf(model, gfile, cfg, skipping_packed(rename, plans), device, dtype, "weights")
        fill_packed(model, gfile, plans)
        if packed.REPACK:
            packed.repack_packed(model, plans)
        if plans:
            packed_bytes = sum(part.nbytes for name in plans for part in model.get_submodule(name).parts)
            log.info("GGUF: %d linear layers kept packed on %s (%.2f GiB)", len(plans), device, packed_bytes / 2**30)
    return model.eval(), cfg


def gguf_info(path: Path) -> dict:
    """What /props and /v1/models say about a GGUF model: file name, quantization type, architecture."""
    gfile = open_gguf(path)
    return {"format": "gguf", "file": gfile.path.name, "quantization": gfile.quantization,
            "architecture": gfile.architecture, "shards": len(gfile.shards)}
