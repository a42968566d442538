"""GGUF encoders in torch (any device): Q8_0, Q4_K and Q6_K blocks from float matrices.

For writing test and benchmark GGUF files of real sizes: the `gguf` library encodes Q8_0 in numpy
(minutes for an 8B model) and cannot encode the K-quants at all. Q8_0 follows the library's
arithmetic (the same bytes); Q4_K and Q6_K are plain round-to-nearest, the same bytes as
tests/gguf_kquants.py's numpy encoder (no search for the best scales, unlike llama.cpp's
quantizer, so the error is somewhat above a llama.cpp file's). Output: uint8 [rows, row bytes].
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

QK_K = 256


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).reshape(-1, 1).view(torch.uint8)


def _safe(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, torch.ones_like(x))


def q8_0(rows: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks of a [rows, cols] matrix (cols a multiple of 32), as `gguf.quants.quantize` writes them."""
    n, cols = rows.shape
    blocks = rows.float().reshape(-1, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / torch.where(d == 0, torch.ones_like(d), d))
    scaled = blocks * inverse
    q = (torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)).to(torch.int8)  # C's roundf: halves away from 0
    return torch.cat([_f16_bytes(d), q.view(torch.uint8)], dim=-1).reshape(n, -1)


def q4_k(rows: torch.Tensor) -> torch.Tensor:
    """Q4_K blocks of a [rows, cols] matrix (cols a multiple of 256)."""
    n = rows.shape[0]
    sub = rows.float().reshape(-1, 8, 32)
    lo = sub.amin(dim=-1).clamp(max=0)
    scale = (sub.amax(dim=-1) - lo) / 15
    offset = -lo
    d = scale.amax(dim=-1) / 63
    dmin = offset.amax(dim=-1) / 63
    d16, dmin16 = d.half().float(), dmin.half().float()
    sc = torch.round(scale / _safe(d16)[:, None]).clamp(0, 63).to(torch.uint8)
    m = torch.round(offset / _safe(dmin16)[:, None]).clamp(0, 63).to(torch.uint8)
    step = (d16[:, None] * sc)[..., None]
    q = torch.round((sub + (dmin16[:, None] * m)[..., None]) / _safe(step)).clamp(0, 15).to(torch.uint8)
    scales = torch.cat([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), m[:, :4] | ((m[:, 4:] >> 4) << 6),
                        (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)], dim=-1)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), scales, qs], dim=-1).reshape(n, -1)


def q6_k(rows: torch.Tensor) -> torch.Tensor:
    """Q6_K blocks of a [rows, cols] matrix (cols a multiple of 256)."""
    n = rows.shape[0]
    sub = rows.float().reshape(-1, 16, 16)
    blocks = sub.shape[0]
    scale = sub.abs().amax(dim=-1) / 31
    d = scale.amax(dim=-1) / 127
    d16 = d.half().float()
    sc = torch.round(scale / _safe(d16)[:, None]).clamp(-128, 127).to(torch.int8)
    step = (d16[:, None] * sc)[..., None]
    q = (torch.round(sub / torch.where(step > 0, step, torch.ones_like(step))) + 32).clamp(0, 63)
    q = q.to(torch.uint8).reshape(blocks, 2, 128)
    low = q & 0x0F
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(blocks, 128)
    high = (q >> 4).reshape(blocks, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(blocks, 64)
    return torch.cat([ql, qh, sc.view(torch.uint8), _f16_bytes(d)], dim=-1).reshape(n, -1)


ENCODERS = {"Q8_0": q8_0, "Q4_K": q4_k, "Q6_K": q6_k}


def encode(rows: torch.Tensor, qtype: str) -> np.ndarray:
    """A [rows, cols] matrix as GGUF `qtype` blocks, uint8 [rows, row bytes]: the torch encoders
    above where there is one (on rows' device), else the `gguf` library's numpy quantizer (the
    Q4_K_M recipe's fallbacks for rows that are not whole super-blocks)."""
    if qtype in ENCODERS:
        return ENCODERS[qtype](rows).cpu().numpy()
    return gguf.quants.quantize(rows.float().cpu().numpy(), gguf.GGMLQuantizationType[qtype])

# llama.cpp's replacement when a row is not a whole number of 256-value super-blocks.
K_QUANT_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def q4_k_m_type(name: str, cols: int, num_layers: int, tied: bool) -> str:
    """The type llama.cpp's Q4_K_M recipe gives GGUF matrix `name` (rows of `cols` values): Q6_K for the
    output head (the embedding when tied) and for attn_v and ffn_down in the first and last eighth of
    the layers and every third layer between; Q4_K for the rest; K_QUANT_FALLBACK where cols % 256."""
    kind = "Q4_K"
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        kind = "Q6_K"
    elif name.startswith("blk.") and (".attn_v." in name or ".ffn_down." in name):
        layer = int(name.split(".")[1])
        eighth = num_layers // 8
        if layer < eighth or layer >= num_layers - eighth or (layer - eighth) % 3 == 2:
            kind = "Q6_K"
    return K_QUANT_FALLBACK[kind] if cols % QK_K else kind
