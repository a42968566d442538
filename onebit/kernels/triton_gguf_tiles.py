"""Packed GGUF products past the few-row kernels' 64 rows (prefill chunks), dequantized into tiles.

Above `triton_gguf_repacked.MAX_INT_ROWS` rows `matmul` dequantizes the whole weight to bfloat16 and
hands it to cuBLAS: for the 8B shape's products that writes and reads back ~15 GB a prefill step
(about 8 ms of memory traffic at the H200's bandwidth) besides the product itself, which at 128 rows is
~2 TFLOP (~3 ms). Here mode "f16s" (`triton_gguf_f16`: float16 tensor cores, each weight dequantized
in registers as float16(d * scale) * code) walks x in tiles of TILE_BLOCK_M rows along a third grid
axis, so each weight tile is dequantized once per row tile and never stored: no extra traffic, more
dequantizing work the more rows. Where the two cross on the device is the measurement
`bench/gpu_gguf_tiles.py` makes; until one is made TILES_MAX_ROWS is 0 and the dequantizing path
stays (set $ONEBIT_GGUF_TILE_ROWS, or the constant, to send products of up to that many rows here).

Types: those mode "f16s" takes (`gguf_repack.F16S_TYPES`: Q4_K, Q5_K, Q6_K); Q8_0 keeps the
dequantizing path. x may come as `F16Rows` from its producer (`models.gguf.packed.PackedInputNorm`).
References: `gguf_repack.repacked_f16_linear_ref` (Q4_K, Q5_K; "f16s" rounds each weight to float16 on
top, ~1e-3) and `repacked_f16s_q6_k_linear_ref` (Q6_K); tests/test_gguf_tiles.py.
"""

from __future__ import annotations

import os

import torch
import triton

from onebit.kernels.gguf_repack import F16_TYPES, F16S_TYPES, F16Rows, RepackedMatrix
from onebit.kernels.triton_gguf_repacked import GROUPING, MAX_INT_ROWS, RepackedConfig, _meta, _operands
from onebit.kernels.triton_split_k import reduce_partials

TILE_ENV = "ONEBIT_GGUF_TILE_ROWS"
# Products of MAX_INT_ROWS < rows <= TILES_MAX_ROWS take `matmul_tiles`; 0: none (not yet measured).
TILES_MAX_ROWS = int(os.environ.get(TILE_ENV, "0"))
# The 64-row decode pick of Q4_K's large products (session 17): 128 weight rows by 64 activation rows a
# program, 4 warps; `programs` sets the split-K as for the few-row launches (counting the row tiles).
TILE_CONFIG = RepackedConfig("f16s", 128, 1, programs=256)
TILE_BLOCK_M = 64


def takes_tiles(weight: RepackedMatrix, rows: int) -> bool:
    """Whether `triton_gguf_repacked.matmul` sends `rows` rows of this weight to `matmul_tiles`."""
    return MAX_INT_ROWS < rows <= TILES_MAX_ROWS and weight.qtype in F16S_TYPES


def tile_split(weight: RepackedMatrix, rows: int, config: RepackedConfig, block_m: int) -> int:
    """Programs along K: a power of two dividing the weight's groups, doubled while the weight-row tiles
    times the activation-row tiles times it stay under config.programs (config.split when set)."""
    groups = weight.cols // GROUPING[weight.qtype][0]
    tiles = triton.cdiv(weight.rows, config.block_n) * triton.cdiv(rows, block_m)
    split, most = 1, config.split or groups
    while split * 2 <= most and groups % (split * 2) == 0 and (config.split or tiles * split < config.programs):
        split *= 2
    return split


def matmul_tiles(x: torch.Tensor | F16Rows, weight: RepackedMatrix, out: torch.Tensor | None = None,
                 config: RepackedConfig = TILE_CONFIG, block_m: int = TILE_BLOCK_M) -> torch.Tensor:
    """x [M, K] (any M; or `F16Rows`) @ weight.T into out [M, rows] (fresh when None; a column slice of a
    wider output is fine) in mode "f16s" (config.mode "f16" for Q4_K / Q5_K also works) over tiles of
    block_m rows: the weight dequantized into each tile in registers, never stored whole."""
    prepared = x if isinstance(x, F16Rows) else None
    if prepared is not None:
        x = prepared.x
    m, k = x.shape
    if k != weight.cols:
        raise ValueError(f"x has {k} columns, the weight {weight.cols}")
    types = {"f16": F16_TYPES, "f16s": F16S_TYPES}.get(config.mode, ())
    if weight.qtype not in types:
        raise ValueError(f'tiles run mode "f16s" on {", ".join(F16S_TYPES)} or "f16" on {", ".join(F16_TYPES)}, '
                         f'not mode "{config.mode}" on {weight.qtype}')
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two of at least 16, got {block_m}")
    if out is None:
        out = torch.empty(m, weight.rows, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    codes, high, scales, d = _operands(weight)
    split = tile_split(weight, m, config, block_m)
    groups = weight.cols // GROUPING[weight.qtype][0]
    target, stride_t, stride_split, reduce = out, out.stride(0), 0, 0
    if split > 1:
        target = torch.empty(split, m, weight.rows, dtype=torch.float32, device=x.device)
        stride_t, stride_split, reduce = weight.rows, m * weight.rows, 1
    grid = (triton.cdiv(weight.rows, config.block_n), split, triton.cdiv(m, block_m))
    from onebit.kernels import triton_gguf_f16  # it builds on triton_gguf_repacked, as this module does

    triton_gguf_f16.launch(x, codes, high, scales, d, target, weight.rows, groups // split, stride_t, stride_split,
                           grid, config.block_n, reduce, config.stages, config.warps, config.mode == "f16s",
                           _meta(weight), prepared, block_m)
    if split > 1:
        reduce_partials(target, None, None, out)
    return out
