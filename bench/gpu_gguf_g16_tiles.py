"""Packed Q4_K products past 64 rows in mode "g16" tiles (`gluon_gguf_q4k.matmul_tiles`) against the weight
dequantized for cuBLAS, what `triton_gguf_repacked.matmul` does there today (#20's dequantize-into-tiles GEMM).

    PYTHONPATH=. python3 bench/gpu_gguf_g16_tiles.py [--out DIR] [--rows 128,512,2048]   # ~1-2 min on an H200

Q4_K weights (random bf16 encoded by onebit.testing.gguf_encode, repacked) at the Qwen3-8B products (qkv
6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288) and --rows activation rows (prefill chunks),
each timed inside a CUDA graph (`onebit.kernels.timing.graph_us`; the tiles pay their `prepare_x` launch
inside the timing): "dequant" (the whole weight to bfloat16, then `F.linear`), "bf16" (`F.linear` on a
bfloat16 weight held in memory: the floor had the weights been stored so) and each CANDIDATES launch.
Every launch is checked against the float32 product with the dequantized weight; one past 1e-2 relative
error, or one that fails, counts as not run. Then per row count the geometric mean over the products of
dequant us / candidate us. Session 21's Triton tiles (f16s over 64-row tiles, removed) made 0.95 / 0.45 /
0.33x at 128 / 512 / 2,048 rows. Results in DIR/g16_tiles.json and .md, the tables printed last.

On the device (carry .whl, see tools/device_wheels.sh: the device lacks gguf):
    . bench/device_lib.sh && install_wheels && PYTHONPATH=$WHEEL_SITE:. python3 bench/gpu_gguf_g16_tiles.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_gguf_repacked import geomean, random_repacked  # noqa: E402

PRODUCTS = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
            "down_proj": (4096, 12288)}
# name -> (block_n, block_m, prefetch): the shipped tile and its neighbours (all fit an SM without spills)
CANDIDATES = {"n64-m128": (64, 128, True), "n64-m128-s1": (64, 128, False), "n64-m64": (64, 64, True),
              "n128-m64-s1": (128, 64, False)}
MAX_ERROR = 1e-2


def measure(rows: list[int]) -> list[dict]:
    """One record per (product, rows): us and relative error of "dequant", "bf16" and each candidate."""
    import torch.nn.functional as F

    from onebit.kernels import gluon_gguf_q4k as g16
    from onebit.kernels import triton_gguf_repacked as tr
    from onebit.kernels.timing import graph_us

    records = []
    for name, (n, k) in PRODUCTS.items():
        w = random_repacked("Q4_K", n, k, torch.device("cuda"))
        dense = w.dequantize(torch.float32)
        dense16 = dense.to(torch.bfloat16)
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            want = x.float() @ dense.t()
            runs = {"dequant": lambda: F.linear(x, tr.dequantize(w, torch.bfloat16)),
                    "bf16": lambda: F.linear(x, dense16)}
            for label, (block_n, block_m, prefetch) in CANDIDATES.items():
                runs[label] = lambda bn=block_n, bm=block_m, p=prefetch: g16.matmul_tiles(x, w, bn, bm, p)
            rec = {"product": name, "rows": m, "us": {}, "rel_err": {}}
            for label, run in runs.items():
                try:
                    got = run().float()
                    rec["rel_err"][label] = ((got - want).norm() / want.norm()).item()
                    rec["us"][label] = graph_us(run)
                except Exception as err:  # a launch this device cannot run is a result, not a crash
                    rec["us"][label] = None
                    rec["rel_err"][label] = f"{type(err).__name__}: {str(err)[:160]}"
            records.append(rec)
            print(json.dumps({key: rec[key] for key in ("product", "rows", "us")}), flush=True)
        del w, dense, dense16
        torch.cuda.empty_cache()
    return records


def speedup(records: list[dict], label: str, rows: int) -> float:
    """Geometric mean over the products at `rows` of dequant us / `label`'s us (nan unless it ran right
    everywhere)."""
    group = [r for r in records if r["rows"] == rows]
    ok = [r for r in group if isinstance(r["us"].get(label), float) and isinstance(r["rel_err"].get(label), float)
          and r["rel_err"][label] < MAX_ERROR]
    if not group or len(ok) < len(group):
        return float("nan")
    return geomean([r["us"]["dequant"] / r["us"][label] for r in ok])


def report(records: list[dict], rows: list[int]) -> list[str]:
    """Markdown: us per product and rows, each launch's error, then the speed-ups over "dequant"."""
    labels = ["dequant", "bf16"] + list(CANDIDATES)
    lines = ["| product | rows | " + " | ".join(f"{label} us" for label in labels) + " | worst rel err (launch) |",
             "|---|---:|" + "---:|" * (len(labels) + 1)]
    for r in records:
        cells = [f"{r['us'][label]:.1f}" if isinstance(r["us"].get(label), float) else "failed" for label in labels]
        errors = {label: e for label, e in r["rel_err"].items() if isinstance(e, float)}
        worst = max(errors, key=errors.get) if errors else None
        lines.append(f"| {r['product']} | {r['rows']} | " + " | ".join(cells)
                     + (f" | {errors[worst]:.1e} ({worst}) |" if worst else " | - |"))
    lines += ["", "Geometric mean over the products of dequant us / launch us (above 1: faster than dequantizing)", "",
              "| launch | " + " | ".join(f"{m} rows" for m in rows) + " |", "|---|" + "---:|" * len(rows)]
    for label in ["bf16"] + list(CANDIDATES):
        lines.append(f"| {label} | " + " | ".join(f"{speedup(records, label, m):.2f}x" for m in rows) + " |")
    return lines


def main() -> int:
    """Measure, write DIR/g16_tiles.json and .md, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/g16_tiles"))
    ap.add_argument("--rows", default="128,512,2048")
    args = ap.parse_args()
    from onebit.kernels import gluon_gguf_q4k as g16

    if not torch.cuda.is_available() or not g16.available():
        print("needs a CUDA device and a Triton with Gluon", file=sys.stderr)
        return 2
    rows = [int(r) for r in args.rows.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    records = measure(rows)
    (args.out / "g16_tiles.json").write_text(json.dumps(records, indent=1))
    text = "\n".join(report(records, rows))
    (args.out / "g16_tiles.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
