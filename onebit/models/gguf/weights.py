"""GGUF tensors -> the engine's parameters: renamed, dequantized in row chunks, copied straight to the device.

Host memory stays near one chunk (about 128 MiB of float32), not one tensor or the whole model:
the header is memory-mapped, and each chunk of rows is read with a plain file read, dequantized,
moved and dropped in turn (so the file's pages never pile up in this process's resident memory).
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from onebit.kernels.gguf_quants import LAYOUTS, dequantize_blocks
from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.gguf.files import SUPPORTED_TYPES, GGUFFile
from onebit.models.loader import check_complete, destination

CHUNK_ELEMENTS = 1 << 25

_BLOCK = {  # GGUF name inside blk.N. -> Hugging Face name inside layers.N.
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
           "output.weight": "lm_head.weight"}
_BLK = re.compile(r"blk\.(\d+)\.(.+)\.(weight|bias)")


def block_local_name(module: str, kind: str, prefix: str) -> str | None:
    """`prefix` + the Hugging Face name of a GGUF block tensor (`attn_q`, `weight`), None when unknown."""
    hf = _BLOCK.get(module)
    return f"{prefix}{hf}.{kind}" if hf else None


def base_rename(cfg: ModelConfig) -> Callable[[str], str | None]:
    """GGUF name -> our base-model local name; None for tensors the base model does not take
    (rope_freqs, the nextn/MTP blocks past num_layers); the name itself when unknown (an error later)."""
    def rename(name: str) -> str | None:
        if name == "rope_freqs.weight" or (name == "output.weight" and cfg.tie_word_embeddings):
            return None
        if name in _GLOBAL:
            return _GLOBAL[name]
        match = _BLK.fullmatch(name)
        if match is None:
            return name
        block, module, kind = match.groups()
        if int(block) >= cfg.num_layers:
            return None
        return block_local_name(module, kind, f"layers.{block}.") or name
    return rename


def base_gguf_name(local: str) -> str:
    """The GGUF name of a base-model local name (for messages about missing tensors)."""
    inverse = {v: k for k, v in _GLOBAL.items()}
    if local in inverse:
        return inverse[local]
    match = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", local)
    if match:
        gguf_module = {v: k for k, v in _BLOCK.items()}.get(match[2], match[2])
        return f"blk.{match[1]}.{gguf_module}.{match[3]}"
    return local


def _unfused(params: dict) -> set[str]:
    """Local (Hugging Face style) names of every tensor `params` needs, q/k/v and gate/up apart."""
    out = set()
    for name in params:
        if ".qkv_proj." in name:
            out.update(name.replace(".qkv_proj.", f".{p}_proj.") for p in "qkv")
        elif ".gate_up_proj." in name:
            out.update(name.replace(".gate_up_proj.", f".{p}_proj.") for p in ("gate", "up"))
        else:
            out.add(name)
    return out


def dequantize_rows(gfile: GGUFFile, name: str, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """Rows [start, stop) of GGUF tensor `name` as float32 (F16/BF16 as themselves) on `device`.

    F32, F16 and BF16 are reinterpreted in torch; Q8_0, Q4_K, Q5_K and Q6_K are dequantized by torch on
    the device (`onebit.kernels.gguf_quants`); the other types go through `gguf.quants.dequantize` on
    the host, one chunk at a time.
    """
    import gguf

    tensor = gfile.tensors[name]
    kind = tensor.tensor_type.name
    rows = gfile.read_rows(name, start, stop)  # a fresh writable buffer of just these rows
    if kind in ("F32", "F16"):
        return torch.from_numpy(rows).to(device)
    if kind == "BF16":
        return torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16).to(device)
    if kind in LAYOUTS:  # Q8_0, Q4_K, Q5_K, Q6_K: torch's dequantizer on the device (bit-exact with gguf's)
        return dequantize_blocks(torch.from_numpy(rows).to(device), kind)
    return torch.from_numpy(gguf.quants.dequantize(rows, tensor.tensor_type)).to(device)


def unpermute_rows(rows: torch.Tensor, head_rows: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order for `llama` files (rotary pairs (2i, 2i+1) of each head) back to
    Hugging Face's rotate-half order (pairs (i, i + d/2)); `rows` holds whole heads of `head_rows` rows."""
    heads = rows.shape[0] // head_rows
    tail = rows.shape[1:]
    return rows.reshape(heads, head_rows // 2, 2, *tail).transpose(1, 2).reshape(rows.shape)


def _check_type(gfile: GGUFFile, name: str, tensor) -> None:
    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        note = " (IQ quantizations are not supported yet)" if kind.startswith("IQ") else ""
        raise ModelLoadError(f"{gfile.path.name}: tensor {name} has type {kind}, which 1bit cannot load{note}; "
                             f"supported types: {', '.join(SUPPORTED_TYPES)}")


def _plan(gfile: GGUFFile, params: dict, cfg: ModelConfig, rename) -> list[tuple]:
    """(gguf name, tensor, destination view, head rows to unpermute or 0, our name, local name) per tensor."""
    permuted = gfile.architecture == "llama"
    plan = []
    for name, tensor in gfile.tensors.items():
        dest = destination(name, rename, cfg, params, gfile.path.name, gfile.architecture)
        if dest is None:
            continue
        _check_type(gfile, name, tensor)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if shape != tuple(dest.view.shape):
            raise ModelLoadError(f"{gfile.path.name}: tensor {name} has shape {shape}, expected "
                                 f"{tuple(dest.view.shape)} from the file's metadata")
        local = dest.local
        head_rows = cfg.head_dim if permuted and (".q_proj." in local or ".k_proj." in local) else 0
        plan.append((name, tensor, dest.view, head_rows, dest.ours, local))
    return plan


def _chunk_rows(dest: torch.Tensor, head_rows: int) -> int:
    if dest.dim() == 1:
        return dest.shape[0]
    rows = max(1, CHUNK_ELEMENTS // max(1, dest[0].numel()))
    if head_rows:
        rows = max(head_rows, rows // head_rows * head_rows)
    return rows


def fill_from_gguf(module: torch.nn.Module, gfile: GGUFFile, cfg: ModelConfig, rename,
                   device: torch.device, dtype: torch.dtype, what: str, gguf_name=base_gguf_name) -> None:
    """Copy every GGUF tensor that `rename` maps to a local name into `module`'s parameters (fusing q/k/v
    and gate/up, undoing llama's Q/K permutation); ModelLoadError for unexpected, misshapen, missing tensors
    or types that cannot be dequantized."""
    params = dict(module.named_parameters())
    plan = _plan(gfile, params, cfg, rename)
    missing = sorted(_unfused(params) - {entry[5] for entry in plan})
    if missing:
        names = [gguf_name(m) for m in missing]
        raise ModelLoadError(f"{gfile.path.name}: missing {what} tensor{'s' if len(names) > 1 else ''} "
                             + ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
    filled: dict[str, int] = {}
    with tqdm(total=len(plan), desc=f"loading {what} ({gfile.quantization})", unit="tensor", leave=False) as bar:
        for name, tensor, dest, head_rows, ours, _local in plan:
            step = _chunk_rows(dest, head_rows)
            for start in range(0, dest.shape[0], step):
                stop = min(start + step, dest.shape[0])
                try:
                    rows = dequantize_rows(gfile, name, start, stop, device)
                except (ValueError, NotImplementedError) as exc:
                    raise ModelLoadError(f"{gfile.path.name}: cannot dequantize tensor {name}: {exc}") from None
                if head_rows:
                    rows = unpermute_rows(rows, head_rows)
                dest.narrow(0, start, stop - start).copy_(rows.reshape(stop - start, *dest.shape[1:]))
            filled[ours] = filled.get(ours, 0) + 1
            bar.update(1)
    check_complete(params, filled, what)
