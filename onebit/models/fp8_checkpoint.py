"""Loading FP8 checkpoints as published (config.json `quantization_config.quant_method == "fp8"`).

Two layouts exist, both with e4m3 weights (`*.weight` in float8_e4m3fn):
- block-scaled (DeepSeek-V3, Qwen3-*-FP8; `weight_block_size` [128, 128] in the config):
  `*.weight_scale_inv` [ceil(N/bn), ceil(K/bk)] float32, weight = q * scale_inv of its block.
  Kept as is (`Fp8BlockLinear`): the few-row kernel applies each block's scale to its partial
  product, so no accuracy is lost to a conversion.
- per-tensor or per-channel (`weight_scale`, a scalar or [N] / [N, 1]): loaded into the
  per-output-channel `Fp8Linear` of `--quantize fp8` (a per-tensor scale repeated on its rows).
Static activation scales (`input_scale`) are ignored: activations are used as they are (few rows)
or quantized per token (`kernels.fp8`). Tensors stored unquantized (norms, embeddings, the LM head,
`modules_to_not_convert`) load as usual. A fused layer (q/k/v, gate/up) whose shards do not start
on block boundaries cannot share one block grid: its shards are dequantized into the model dtype
(logged), which the real checkpoints (every shard a multiple of 128 rows) never need.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from onebit.kernels import fp8
from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.layers import Linear
from onebit.models.loader import base_name, build_on_device, check_complete, param_target, weight_files
from onebit.models.quantize import Fp8Linear
from onebit.models.transformer import CausalLM

log = logging.getLogger("onebit.models")
SCALE_SUFFIXES = ("weight_scale_inv", "weight_scale")


def fp8_quantization(path: Path) -> dict | None:
    """The checkpoint's FP8 `quantization_config`, or None for an unquantized one; ModelLoadError
    for a quantization 1bit cannot load."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # ModelConfig.from_dir reports it
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method")
    if method != "fp8":
        raise ModelLoadError(f"quantization_config.quant_method {method!r} is not supported; "
                             "1bit loads fp8 checkpoints (or unquantized ones, with --quantize fp8)")
    if quant.get("fmt", "e4m3") != "e4m3":
        raise ModelLoadError(f"FP8 format {quant.get('fmt')!r} is not supported; only e4m3")
    block = quant.get("weight_block_size")
    if block is not None and (len(block) != 2 or min(block) < 16 or any(b & (b - 1) for b in block)):
        raise ModelLoadError(f"weight_block_size {block} is not supported: two powers of two >= 16")
    return quant


class Fp8BlockLinear(nn.Module):
    """A linear layer whose e4m3 weight [N, K] has one float32 scale per (bn x bk) block."""

    def __init__(self, out_features: int, in_features: int, block: tuple[int, int], bias: bool,
                 device: torch.device, dtype: torch.dtype):
        super().__init__()
        bn, bk = block
        self.block = (bn, bk)
        self.out_features, self.in_features = out_features, in_features
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=fp8.FP8, device=device))
        self.register_buffer("weight_scale_inv", torch.empty(-(-out_features // bn), -(-in_features // bk),
                                                             dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device),
                                 requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x @ (weight * its block's scale).T + bias."""
        return fp8.linear_blocks(x, self.weight, self.weight_scale_inv, self.block, self.bias)


def fp8_block_layers(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor, tuple[int, int], torch.Tensor | None]]:
    """Every `Fp8BlockLinear` of `model` by name: (weight, weight_scale_inv, block, bias), for
    `fp8.calibrate_blocks`."""
    return {name: (m.weight, m.weight_scale_inv, m.block, m.bias) for name, m in model.named_modules()
            if isinstance(m, Fp8BlockLinear)}


def _shard_rows(cfg: ModelConfig, fused: str) -> list[int]:
    """Row counts of the checkpoint shards a fused layer holds (one for an unfused layer)."""
    if fused.endswith("qkv_proj"):
        kv = cfg.num_kv_heads * cfg.head_dim
        return [cfg.num_heads * cfg.head_dim, kv, kv]
    if fused.endswith("gate_up_proj"):
        return [cfg.intermediate_size] * 2
    return []


def _convert_modules(model: CausalLM, cfg: ModelConfig, stored: dict[str, torch.dtype], has_block_scale: set[str],
                     block: tuple[int, int] | None, device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """Replace each decoder Linear whose checkpoint weights are e4m3 by its FP8 form; returns
    local module name -> "block", "channel" or "dequantize" (kept in `dtype`)."""
    kinds = {}
    for name, module in list(model.named_modules()):
        if not isinstance(module, Linear) or name == "lm_head":
            continue
        if stored.get(name + ".weight") != fp8.FP8:
            continue
        if name in has_block_scale:
            aligned = all(rows % block[0] == 0 for rows in _shard_rows(cfg, name)[:-1])
            kinds[name] = "block" if aligned else "dequantize"
        else:
            kinds[name] = "channel"
        if kinds[name] == "dequantize":
            continue
        has_bias = module.bias is not None
        if kinds[name] == "block":
            new = Fp8BlockLinear(module.out_features, module.in_features, block, has_bias, device, dtype)
        else:
            new = Fp8Linear(torch.empty(module.out_features, module.in_features, dtype=fp8.FP8, device=device),
                            torch.empty(module.out_features, dtype=torch.float32, device=device),
                            torch.empty(module.out_features, dtype=dtype, device=device) if has_bias else None)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    return kinds


def _scan(files: list[Path], cfg: ModelConfig):
    """(checkpoint name -> file, local fused weight name -> stored dtype, fused modules with block scales)."""
    where, stored, block_scaled = {}, {}, set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():
                    where[name] = file
                    local = base_name(name, cfg)
                    if local is None:
                        continue
                    _, _, _, ours = param_target(local, cfg, {})
                    if name.endswith(".weight"):
                        stored[ours] = _dtype(handle, name)
                    elif name.endswith(".weight_scale_inv"):
                        block_scaled.add(ours.rpartition(".")[0])
        except ModelLoadError:
            raise
        except Exception as exc:  # safetensors raises its own error types
            raise ModelLoadError(f"cannot read weights {file.name}: {exc}") from None
    return where, stored, block_scaled


def _dtype(handle, name: str) -> torch.dtype:
    names = {"F8_E4M3": fp8.FP8, "F8_E5M2": torch.float8_e5m2, "BF16": torch.bfloat16, "F16": torch.float16,
             "F32": torch.float32}
    return names.get(handle.get_slice(name).get_dtype(), torch.float32)


def load_fp8_checkpoint(path: Path, device: torch.device, dtype: torch.dtype,
                        quant: dict) -> tuple[CausalLM, ModelConfig]:
    """Build the model for the FP8 checkpoint at `path` and fill it (e4m3 weights stay e4m3)."""
    cfg = ModelConfig.from_dir(path)
    files = weight_files(path)
    block = tuple(quant["weight_block_size"]) if quant.get("weight_block_size") else None
    where, stored, block_scaled = _scan(files, cfg)
    if block_scaled and block is None:
        raise ModelLoadError("the checkpoint has weight_scale_inv tensors but config.json gives no weight_block_size")
    model = build_on_device(lambda: CausalLM(cfg), device, dtype)
    kinds = _convert_modules(model, cfg, stored, block_scaled, block, device, dtype)
    dequantized = [n for n, kind in kinds.items() if kind == "dequantize"]
    if dequantized:
        log.warning("%d fused layers have shards off the %s block grid; dequantized to %s (e.g. %s)",
                    len(dequantized), block, dtype, dequantized[0])
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    filled: dict[str, int] = {}
    handles = {}

    def read(name: str) -> torch.Tensor:
        file = where.get(name)
        if file is None:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}")
        if file not in handles:
            handles[file] = safe_open(str(file), framework="pt", device="cpu")
        return handles[file].get_tensor(name)

    def dequantized(name: str, q: torch.Tensor) -> torch.Tensor:
        """An e4m3 weight kept in the model dtype: times its block or row scales."""
        prefix = name[:-len("weight")]
        if prefix + "weight_scale_inv" in where:
            return fp8.dequantize_blocks(q, read(prefix + "weight_scale_inv"), block)
        if prefix + "weight_scale" in where:
            scale = read(prefix + "weight_scale").float().reshape(-1)
            return fp8.dequantize_rows(q, scale.expand(q.shape[0]) if scale.numel() == 1 else scale)
        raise ModelLoadError(f"e4m3 tensor {name!r} has no weight_scale_inv or weight_scale beside it")

    for name in where:
        local = base_name(name, cfg)
        if local is None or name.endswith(".input_scale"):
            continue
        target, start, size, ours = param_target(local, cfg, targets)
        module_name, _, leaf = ours.rpartition(".")
        kind = kinds.get(module_name)
        if leaf in SCALE_SUFFIXES and kind not in ("block", "channel"):
            continue  # read with its weight below
        tensor = read(name)
        if kind == "channel" and leaf in ("weight", "weight_scale"):
            ours = f"{module_name}.qweight" if leaf == "weight" else ours
            target = targets[ours]
            if leaf == "weight_scale":  # one scale for the whole tensor, or one per row
                rows = size if start is not None else target.shape[0]
                tensor = tensor.float().reshape(-1)
                tensor = tensor.expand(rows) if tensor.numel() == 1 else tensor
        elif kind == "block" and leaf == "weight_scale_inv" and start is not None:
            start, size = start // block[0], -(-size // block[0])  # shards start on block rows
        elif (tensor.dtype in (fp8.FP8, torch.float8_e5m2) and kind is None) or (kind == "dequantize" and leaf == "weight"):
            tensor = dequantized(name, tensor)
        if target is None:
            raise ModelLoadError(f"{Path(where[name]).name}: unexpected tensor {name!r} for {cfg.architecture}")
        dest = target.data if start is None else target.data.narrow(0, start, size)
        if tuple(dest.shape) != tuple(tensor.shape):
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
        dest.copy_(tensor.to(device=device, dtype=dest.dtype))
        filled[ours] = filled.get(ours, 0) + 1
    check_complete(targets, filled, "weights")
    return model.eval(), cfg
