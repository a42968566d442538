"""Launch table of the batch-invariant product (`triton_invariant_matmul`), per device and
weight shape: the split count of K (one per shape, the same for every M) and, per range of row
counts, the launch (BLOCK_N, warps, stages, BLOCK_M, BLOCK_K).

Every entry comes from bench/gpu_invariant_sweep.py on that device, which keeps a launch only if
its rows are bit-identical to the reference launch of the same split count at M = 1 and 256, so
switching launches with M never changes a row. A table measured on one GPU model is not used on
another (the compiler may emit other instructions there): entries are keyed by the device name.

TABLE holds the sweep's JSON (`table.json`, written under $OUT) for each device measured so far;
on any other device the kernel uses its built-in launches. The environment variable
ONEBIT_INVARIANT_TABLE may name such a JSON file to load at import (a device run can try a table
without a commit).
"""

from __future__ import annotations

import functools
import json
import os

import torch

# device name -> "N,K" -> {"splits": S, "launches": [[max_m, block_n, warps, stages, block_m, block_k, variant],
# ...]} (launches sorted by max_m; the last one also serves every larger M; variant: `Launch.variant`, 0 when
# a row has six columns).
TABLE: dict[str, dict[str, dict]] = {
    # bench/gpu_invariant_sweep.py on the H200, 2026-12-01 (session 8, second sweep: Hopper-sized tiles
    # and TMA variants): every launch checked bit-identical at M = 1..256 through the loader.
    "NVIDIA H200": {
        "6144,4096": {
            "splits": 1,
            "launches": [
                [1, 64, 4, 4, 16, 256, 0],
                [2, 64, 4, 4, 16, 256, 0],
                [4, 32, 4, 4, 16, 256, 0],
                [8, 32, 4, 4, 16, 256, 0],
                [16, 32, 4, 4, 16, 256, 0],
                [32, 64, 4, 5, 64, 128, 0],
                [64, 64, 4, 5, 64, 128, 2],
                [128, 128, 8, 4, 64, 128, 0],
                [256, 64, 4, 4, 64, 64, 1],
            ],
        },
        "4096,4096": {
            "splits": 2,
            "launches": [
                [1, 64, 4, 4, 64, 128, 0],
                [2, 64, 4, 4, 64, 128, 0],
                [4, 64, 4, 4, 64, 128, 0],
                [8, 64, 4, 4, 64, 128, 0],
                [16, 64, 4, 4, 64, 128, 0],
                [32, 64, 4, 4, 64, 64, 0],
                [64, 64, 4, 4, 64, 64, 1],
                [128, 128, 4, 5, 64, 64, 2],
                [256, 128, 4, 4, 64, 64, 1],
            ],
        },
        "24576,4096": {
            "splits": 1,
            "launches": [
                [1, 64, 4, 4, 16, 64, 0],
                [2, 64, 4, 4, 16, 64, 0],
                [4, 64, 4, 4, 16, 128, 0],
                [8, 64, 4, 4, 16, 64, 0],
                [16, 64, 4, 4, 16, 64, 0],
                [32, 64, 4, 4, 64, 64, 0],
                [64, 64, 4, 4, 64, 64, 0],
                [128, 256, 8, 4, 128, 64, 2],
                [256, 128, 8, 3, 128, 128, 2],
            ],
        },
        "4096,12288": {
            "splits": 4,
            "launches": [
                [1, 64, 4, 6, 64, 64, 0],
                [2, 64, 4, 6, 64, 64, 0],
                [4, 64, 4, 6, 64, 64, 0],
                [8, 64, 4, 6, 64, 64, 0],
                [16, 64, 4, 6, 64, 64, 0],
                [32, 128, 4, 5, 64, 64, 1],
                [64, 128, 4, 5, 64, 64, 1],
                [128, 128, 4, 4, 64, 64, 1],
                [256, 256, 8, 4, 128, 64, 0],
            ],
        },
        "151936,4096": {
            "splits": 1,
            "launches": [
                [1, 64, 4, 4, 16, 128, 0],
                [2, 64, 4, 4, 16, 128, 0],
                [4, 64, 4, 4, 16, 128, 0],
                [8, 64, 4, 4, 16, 128, 0],
                [16, 64, 4, 4, 16, 128, 0],
                [32, 128, 8, 4, 64, 128, 0],
                [64, 128, 4, 4, 64, 128, 1],
                [128, 128, 8, 3, 128, 64, 3],
                [256, 256, 8, 4, 128, 64, 2],
            ],
        },
    },
}


def load(path: str) -> None:
    """Merge the sweep's JSON table ({"device": name, "shapes": {"N,K": entry}}) into TABLE."""
    with open(path) as f:
        data = json.load(f)
    shapes = TABLE.setdefault(data["device"], {})
    for key, entry in data["shapes"].items():
        launches = sorted((list(map(int, row)) for row in entry["launches"]), key=lambda row: row[0])
        if not launches or any(len(row) not in (6, 7) for row in launches):  # 7th: the kernel variant
            raise ValueError(f"{path}: launches of {key} must be [max_m, block_n, warps, stages, block_m, block_k"
                             "(, variant)] rows")
        shapes[key] = {"splits": int(entry["splits"]), "launches": launches}


@functools.lru_cache(maxsize=None)
def _name_of(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _device_name(device: torch.device) -> str:
    return _name_of(device.index if device.index is not None else torch.cuda.current_device())


def lookup(n: int, k: int, m: int, device: torch.device) -> tuple[int, tuple[int, ...]] | None:
    """(splits, (block_n, warps, stages, block_m, block_k[, variant])) for M rows of an [N, K]
    weight on this CUDA device, or None when the table has no entry for it."""
    if not TABLE:
        return None
    entry = TABLE.get(_device_name(device), {}).get(f"{n},{k}")
    if entry is None:
        return None
    launches = entry["launches"]
    row = next((r for r in launches if m <= r[0]), launches[-1])
    return entry["splits"], tuple(row[1:])


if os.environ.get("ONEBIT_INVARIANT_TABLE"):
    load(os.environ["ONEBIT_INVARIANT_TABLE"])
