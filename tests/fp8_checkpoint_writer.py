"""Test helper: rewrite a model directory as a published-style FP8 checkpoint.

The decoder's linear weights become e4m3 with either block scales (`weight_scale_inv`
[ceil(N/bn), ceil(K/bk)], `weight_block_size` in the config: the DeepSeek-V3 / Qwen3-FP8 layout),
one scale per row or one per tensor (`weight_scale`); config.json gains the
`quantization_config` those checkpoints carry. Everything else is copied unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FP8 = torch.float8_e4m3fn
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_blocks(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale_inv per block) with w ~= q * scale_inv of q's block."""
    n, k = w.shape
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk)
    padded[:n, :k] = w.float()
    blocks = padded.view(rows, bn, cols, bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view(rows * bn, cols * bk)[:n, :k].to(FP8)
    return q, scale


def write_fp8_checkpoint(src: Path, out: Path, scheme: str = "block", block: tuple[int, int] = (128, 128)) -> Path:
    """Write `src` (a model directory with one model.safetensors) to `out` as an FP8 checkpoint.

    scheme: "block" (weight_scale_inv), "channel" (weight_scale [N, 1]) or "tensor" (a scalar weight_scale)."""
    out.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if file.is_file() and file.suffix != ".safetensors":
            shutil.copy(file, out / file.name)
    tensors = load_file(str(src / "model.safetensors"))
    written = {}
    for name, w in tensors.items():
        if not (name.startswith("model.layers.") and name.endswith(".weight") and name.split(".")[-2] in LINEAR):
            written[name] = w
            continue
        prefix = name[:-len("weight")]
        if scheme == "block":
            written[name], written[prefix + "weight_scale_inv"] = quantize_blocks(w, *block)
        else:
            amax = w.float().abs().amax(dim=1, keepdim=True) if scheme == "channel" else w.float().abs().amax()
            scale = (amax / 448.0).clamp_min(1e-12)
            written[name] = (w.float() / scale).clamp(-448, 448).to(FP8)
            written[prefix + "weight_scale"] = scale.reshape(()) if scheme == "tensor" else scale
    save_file(written, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    if scheme == "block":
        config["quantization_config"]["weight_block_size"] = list(block)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def dequantized_weights(path: Path) -> dict[str, torch.Tensor]:
    """The FP8 checkpoint's tensors with every e4m3 weight multiplied back by its scales (float32)."""
    tensors = load_file(str(path / "model.safetensors"))
    block = json.loads((path / "config.json").read_text())["quantization_config"].get("weight_block_size")
    out = {}
    for name, t in tensors.items():
        if name.endswith(("weight_scale_inv", "weight_scale")):
            continue
        if t.dtype == FP8:
            prefix = name[:-len("weight")]
            if prefix + "weight_scale_inv" in tensors:
                s = tensors[prefix + "weight_scale_inv"]
                s = s.repeat_interleave(block[0], 0)[:t.shape[0]].repeat_interleave(block[1], 1)[:, :t.shape[1]]
            else:
                s = tensors[prefix + "weight_scale"].float().reshape(-1, 1) if tensors[prefix + "weight_scale"].numel() > 1 \
                    else tensors[prefix + "weight_scale"].float()
            t = t.float() * s
        out[name] = t
    return out
