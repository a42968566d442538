"""FP8 weight products on the device: correctness against the references, then time per product.

    PYTHONPATH=. python3 bench/gpu_fp8.py [--out DIR]

For each product shape of the Qwen3-8B layers, times inside a CUDA graph (20 products per replay,
so launch gaps are those of a real step): cuBLAS bf16 `F.linear`, the Triton FP8 weight-only kernel
for every config (up to its MAX_ROWS rows), and `torch._scaled_mm` with per-token activation
quantization (more rows). Prints microseconds and the weight bytes per second for each, and which config
won per shape, as a markdown table (also written to DIR/fp8.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from onebit.kernels import fp8, triton_fp8
from onebit.kernels.timing import graph_us

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096), "down_proj": (4096, 12288)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    lines = ["| product | rows | bf16 cuBLAS us (TB/s) | FP8 best us (TB/s) | best config | default config us | "
             "speed-up | rel. err |", "|---|---:|---:|---:|---|---:|---:|---:|"]
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        q, scale = fp8.quantize_rows(w)
        for m in (1, 4, 16, 64, 128, 256):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            bf16_us = graph_us(lambda: F.linear(x, w))
            if m <= triton_fp8.MAX_ROWS:
                want = fp8.weight_only_ref(x.float(), q, scale, None)
                timed = {}
                for config in triton_fp8.CONFIGS:
                    try:
                        got = triton_fp8.weight_only(x, q, scale, None, config).float()
                    except Exception as error:  # a config this device cannot compile is no candidate
                        print(f"{name} {m} {config}: {error}")
                        continue
                    err = ((got - want).norm() / want.norm()).item()
                    if err > 1e-2:
                        print(f"{name} {m} {config}: WRONG (rel. err {err:.2e})")
                        continue
                    timed[config] = (graph_us(lambda: triton_fp8.weight_only(x, q, scale, None, config)), err)
                best = min(timed, key=lambda c: timed[c][0])
                best_us, err = timed[best]
                default_us = timed.get(triton_fp8.DEFAULT_CONFIG if m <= 16 else triton_fp8.MANY_ROWS_CONFIG,
                                       (float("nan"),))[0]
            else:
                want = fp8.w8a8_ref(x.float(), q, scale, None)
                got = fp8.linear(x, q, scale, None).float()
                err = ((got - want).norm() / want.norm()).item()
                best, best_us = "scaled_mm", graph_us(lambda: fp8.linear(x, q, scale, None))
                default_us = best_us
            lines.append(f"| {name} {n}x{k} | {m} | {bf16_us:.1f} ({n * k * 2 / bf16_us / 1e6:.2f}) | "
                         f"{best_us:.1f} ({n * k / best_us / 1e6:.2f}) | {best} | {default_us:.1f} | "
                         f"{bf16_us / best_us:.2f}x | {err:.1e} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
