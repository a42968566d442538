"""Q4_K and Q6_K encoders for tests: the `gguf` library dequantizes these types but cannot quantize them.

Plain round-to-nearest (no search for the best scales, unlike llama.cpp's quantizer), written as
the exact inverse of the block layouts that `gguf.quants` decodes; good enough to give real
K-quant files whose error is that of the format.
"""

from __future__ import annotations

import gguf
import numpy as np

QK = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    sub = blocks.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0)
    scale = (sub.max(axis=-1) - lo) / 15
    offset = -lo
    d = scale.max(axis=-1) / 63
    dmin = offset.max(axis=-1) / 63
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d16 > 0, d16, 1)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(offset / np.where(dmin16 > 0, dmin16, 1)[:, None]), 0, 63).astype(np.uint8)
    step = (d16[:, None] * sc)[..., None]
    q = np.clip(np.round((sub + (dmin16[:, None] * m)[..., None]) / np.where(step > 0, step, 1)), 0, 15)
    q = q.astype(np.uint8)
    scales = np.concatenate([
        sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
        m[:, :4] | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
    ], axis=-1)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d), _f16_bytes(dmin), scales, qs], axis=-1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31
    d = scale.max(axis=-1) / 127
    d16 = d.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d16 > 0, d16, 1)[:, None]), -128, 127).astype(np.int8)
    step = (d16[:, None] * sc)[..., None]
    q = np.clip(np.round(sub / np.where(step > 0, step, 1)) + 32, 0, 63).astype(np.uint8).reshape(n, 2, 128)
    # value h*128 + k*64 + b: nibble k of ql[h*64 + b]; value h*128 + s*32 + b: bits 2s of qh[h*32 + b]
    low = q & 0x0F
    ql = (low[:, :, :64] | (low[:, :, 64:] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)
    qh = (high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d)], axis=-1)


def quantize_k(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """`data` (rows of a multiple of 256 floats) as Q4_K or Q6_K bytes, shape [rows, bytes per row]."""
    rows = data.reshape(-1, data.shape[-1]).astype(np.float32)
    blocks = rows.reshape(-1, QK)
    encoded = _q4_k(blocks) if qtype == gguf.GGMLQuantizationType.Q4_K else _q6_k(blocks)
    return encoded.reshape(*data.shape[:-1], -1)
