"""The FP8 step's one-program-a-row quantizers on 8 warps against 4 (`triton_fp8_fast.FOUR_WARP_ROWS`).

    PYTHONPATH=. python3 bench/gpu_row_quantizers.py [--rows 1,8,64] [--hidden 4096]

One device call, seconds, no wheels. At 64 rows the FP8 step ran `_add_rms_norm_quantize_kernel` at 3.3 us
a launch (72 a step) and o's `_quantize_rows_kernel` at 2.4 (36), against 2.05 for the bf16 norm on 4 warps
(session 33's profile, PDL off). Each kernel is timed in CUDA graphs with PDL off (`timing.graph_us`: a
launch's whole latency, no overlap) on random rows, both ways, the bf16 norm beside them. Prints a table.
"""

from __future__ import annotations

import argparse

import torch

from onebit.kernels import pdl, timing, triton_fp8_fast, triton_fp8_fused, triton_fused


def main() -> None:
    """Parse, time, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--hidden", type=int, default=4096)
    args = ap.parse_args()
    pdl.enabled = False
    print("| rows | bf16 norm us (4 warps) | norm + quantize us, 8 / 4 warps | o's quantizer us, 8 / 4 warps |")
    print("|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        x, res = (torch.randn(rows, args.hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.rand(args.hidden, device="cuda", dtype=torch.bfloat16) + 0.5
        plain = timing.graph_us(lambda: triton_fused.add_rms_norm(x, res, w, 1e-6))
        times = {}
        for four in (False, True):
            triton_fp8_fast.FOUR_WARP_ROWS = four
            times[four] = (timing.graph_us(lambda: triton_fp8_fused.add_rms_norm_quantize(x, res, w, 1e-6)),
                           timing.graph_us(lambda: triton_fp8_fast.quantize_rows(x)))
        triton_fp8_fast.FOUR_WARP_ROWS = False
        print(f"| {rows} | {plain:.2f} | {times[False][0]:.2f} / {times[True][0]:.2f} | "
              f"{times[False][1]:.2f} / {times[True][1]:.2f} |")


if __name__ == "__main__":
    main()
