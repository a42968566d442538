"""An MTP head from GGUF: llama.cpp's `nextn` layout mapped onto the engine's MTPHead (tools/mtp_layout.md).

Supported layout (DeepSeek-V3 / GLM-4.5 MTP as llama.cpp's converter writes it), for one block N:
`blk.N.nextn.enorm` (norm of the next token's embedding), `blk.N.nextn.hnorm` (norm of the
hidden state), `blk.N.nextn.eh_proj` ([H, 2H], embedding half first), `blk.N.nextn.shared_head_norm`
(final norm), and the block's ordinary decoder tensors `blk.N.attn_*` / `blk.N.ffn_*`. The
head's own `nextn.embed_tokens` / `nextn.shared_head_head` copies, when present, are not read:
the engine's head shares the base model's embedding and LM head.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.gguf.files import open_gguf
from onebit.models.gguf.metadata import ARCHITECTURES
from onebit.models.gguf.weights import _BLK, block_local_name, fill_from_gguf

log = logging.getLogger("onebit.models")

_NEXTN = {"enorm": "pre_fc_norm_embedding.weight", "hnorm": "pre_fc_norm_hidden.weight",
          "eh_proj": "fc.weight", "shared_head_norm": "norm.weight"}
_SHARED = ("embed_tokens", "shared_head_head")
LAYOUT = ("llama.cpp's nextn layout: blk.N.nextn.{enorm,hnorm,eh_proj,shared_head_norm}.weight plus the "
          "block's blk.N.attn_*/ffn_* tensors, for a llama, qwen2 or qwen3 model")


def _nextn_block(names: list[str]) -> int | None:
    blocks = sorted({int(m[1]) for n in names if (m := re.fullmatch(r"blk\.(\d+)\.nextn\.eh_proj\.weight", n))})
    if len(blocks) > 1:
        log.warning("the GGUF file holds %d nextn blocks; the engine's MTP head uses the first (block %d)",
                     len(blocks), blocks[0])
    return blocks[0] if blocks else None


def has_gguf_mtp(path: Path) -> bool:
    """True when the GGUF file at `path` carries a nextn (MTP) block."""
    return _nextn_block(list(open_gguf(path).tensors)) is not None


def fill_mtp_from_gguf(head: torch.nn.Module, source: Path, cfg: ModelConfig,
                       device: torch.device, dtype: torch.dtype) -> None:
    """Fill `head` (an MTPHead) from the nextn block of the GGUF file `source`; ModelLoadError saying
    which layout is supported when the file holds none, or holds one for another architecture."""
    gfile = open_gguf(source)
    block = _nextn_block(list(gfile.tensors))
    if block is None:
        raise ModelLoadError(f"{gfile.path.name} holds no MTP head in a layout 1bit can map; supported: {LAYOUT}")
    arch = gfile.architecture
    if ARCHITECTURES.get(arch, (None, None))[1] != cfg.family:
        raise ModelLoadError(f"{gfile.path.name}: MTP head for architecture {arch!r}, but the model is "
                             f"{cfg.family}; supported: {LAYOUT}")
    prefix = f"blk.{block}."
    if any(f"{prefix}nextn.{s}.weight" in gfile.tensors for s in _SHARED):
        log.info("%s: the MTP head's own embedding/LM head copies are not read; the base model's are shared",
                 gfile.path.name)

    def rename(name: str) -> str | None:
        if not name.startswith(prefix):
            return None
        if name.startswith(prefix + "nextn."):
            part = name[len(prefix + "nextn."):].removesuffix(".weight")
            return None if part in _SHARED else _NEXTN.get(part, name)
        match = _BLK.fullmatch(name)
        return block_local_name(match[2], match[3], "layers.0.") or name if match else name

    inverse = {v: f"{prefix}nextn.{k}.weight" for k, v in _NEXTN.items()}

    def gguf_name(local: str) -> str:
        if local in inverse:
            return inverse[local]
        from onebit.models.gguf.weights import base_gguf_name
        return base_gguf_name(local).replace("blk.0.", prefix, 1)

    fill_from_gguf(head, gfile, cfg, rename, device, dtype, "MTP head", gguf_name)
