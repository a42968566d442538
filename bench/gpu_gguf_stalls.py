"""What the packed GGUF few-row kernels wait on: one launch per config under Nsight Compute (#20).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        python3 bench/gpu_gguf_stalls.py [--product lm_head] [--rows 1] [--configs Q4_K:fma-n64-g2,Q4_K:i8-n32-g4-s1]

Builds random repacked weights of each (type, config) pair at one Qwen3-8B product, launches every
config once to compile it, then launches each once more between cudaProfilerStart/Stop, so that ncu
(`--profile-from-start off`) profiles exactly those launches (split-K sums and x quantizers
included). Without ncu it prints each config's time in a CUDA graph, as a sanity check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    """Launch the chosen configs once each inside the profiler's window."""
    from bench.gpu_gguf_repacked import PRODUCTS, random_repacked
    from onebit.kernels import triton_gguf_repacked as tr
    from onebit.kernels.timing import graph_us

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--product", default="lm_head", choices=sorted(PRODUCTS))
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--configs", default="Q4_K:fma-n64-g2,Q4_K:i8-n32-g4-s1,Q8_0:fma-n64-g2",
                    help="comma-separated TYPE:CONFIG pairs (CONFIG a triton_gguf_repacked.CONFIGS name)")
    args = ap.parse_args()
    n, k = PRODUCTS[args.product]
    pairs = [item.split(":") for item in args.configs.split(",")]
    weights = {qtype: random_repacked(qtype, n, k, torch.device("cuda")) for qtype in {q for q, _ in pairs}}
    x = torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16)
    for qtype, label in pairs:  # compile and warm
        tr.matmul_few_rows(x, weights[qtype], config=tr.CONFIGS[label])
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for qtype, label in pairs:
        tr.matmul_few_rows(x, weights[qtype], config=tr.CONFIGS[label])
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for qtype, label in pairs:
        us = graph_us(lambda: tr.matmul_few_rows(x, weights[qtype], config=tr.CONFIGS[label]))
        tb = weights[qtype].nbytes / us / 1e6
        print(f"{args.product} {qtype} {label} rows {args.rows}: {us:.1f} us ({tb:.2f} TB/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
