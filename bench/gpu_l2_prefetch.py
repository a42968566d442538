"""The L2 prefetch of a weight from a second stream during the attention window (`onebit.kernels.l2_prefetch`).

    PYTHONPATH=. python3 bench/gpu_l2_prefetch.py [--rows 1,8] [--out DIR]

A decode layer at one row: qkv product, then ~7-9 us of attention kernels that leave memory idle, then
the o product streaming its weight. Here, per weight size (bf16 [4096, 4096] = the 8B shape's o in bf16,
33.5 MB; [4096, 2048] = its e4m3 bytes, 16.8 MB; [4096, 1152] ~ its Q4_K bytes, 9.4 MB) and row count,
timed in CUDA graphs over rotated weight copies (`timing.ProductTimer`) with PDL as the engine runs it:

- product: `gemv.linear` alone (cuBLAS or the calibrated Triton kernel: no calibration here, so cuBLAS);
- window+product: the real decode attention (B rows, 32 query heads over 8 KV heads, 256-token contexts,
  adaptive splits) then the product;
- side-prefetch{N}k: the window inside `l2_prefetch.prefetching([weight])` (the prefetch forked onto the
  second stream, joined before the product), then the product, at chunks of 4, 16 and 64 KB a thread.

Session 24 ran the prefetch inside the step's stream instead and lost (it held the chain for the copy's
time). Printed last: a table of us per variant and the saving a layer (window+product minus side-prefetch16k).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from onebit.kernels import gemv, l2_prefetch
from onebit.kernels.timing import ProductTimer
from onebit.kernels.triton_decode import paged_decode_attention

SIZES = [("o bf16 33.5 MB", 4096, 4096), ("e4m3-sized 16.8 MB", 4096, 2048), ("Q4_K-sized 9.4 MB", 4096, 1152)]
CHUNKS = [4 << 10, 16 << 10, 64 << 10]
HEADS, KV_HEADS, HEAD_DIM, CONTEXT, BLOCK_SIZE = 32, 8, 128, 256, 16


def attention_window(rows: int, device):
    """A no-argument callable running the decode attention over rows 256-token contexts."""
    blocks = rows * CONTEXT // BLOCK_SIZE
    k = torch.randn(blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(rows, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    tables = torch.arange(blocks, device=device, dtype=torch.int32).view(rows, -1)
    lens = torch.full((rows,), CONTEXT, device=device, dtype=torch.int32)
    return lambda: paged_decode_attention(q, k, v, tables, lens, HEAD_DIM ** -0.5, num_splits=None,
                                          max_context=4096)


def side_prefetch(w, chunk: int, window, product):
    """The window with w asked into L2 from the second stream (chunk bytes a thread), then the product."""
    with l2_prefetch.prefetching([w], chunk):
        window()
    return product()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"GPU: {torch.cuda.get_device_name()}  prefetch usable: {l2_prefetch.usable(0)}")
    records = []
    for label, n, k in SIZES:
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        with ProductTimer(w) as clock:
            for rows in map(int, args.rows.split(",")):
                x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
                window = attention_window(rows, device)
                variants = {"product": lambda w: gemv.linear(x, w),
                            "window": lambda w: window(),
                            "window+product": lambda w: (window(), gemv.linear(x, w))}
                for chunk in CHUNKS:
                    variants[f"side-prefetch{chunk >> 10}k"] = (
                        lambda w, chunk=chunk: side_prefetch(w, chunk, window, lambda: gemv.linear(x, w)))
                us = {name: clock.us(fn) for name, fn in variants.items()}
                records.append(dict(weight=label, rows=rows, us=us))
                print(f"{label}, {rows} row(s): " + ", ".join(f"{name} {t:.2f}" for name, t in us.items()), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "l2_prefetch.json").write_text(json.dumps(records, indent=1))
    names = list(records[0]["us"])
    print("\n| weight | rows | " + " | ".join(names) + " | saved a layer, us (16k) |")
    print("|---|---:|" + "---:|" * (len(names) + 1))
    for r in records:
        saved = r["us"]["window+product"] - r["us"]["side-prefetch16k"]
        print(f"| {r['weight']} | {r['rows']} | " + " | ".join(f"{r['us'][name]:.2f}" for name in names)
              + f" | {saved:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
