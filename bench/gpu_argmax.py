"""The greedy sampler's argmax over a step's logits: torch.argmax against the two-pass Triton kernel.

    PYTHONPATH=. python3 bench/gpu_argmax.py [--rows 1,8,64,256] [--vocab 151936] [--dtype bfloat16]

One device call, seconds, no wheels. Each row count's logits (random, the model's dtype) are argmaxed
both ways, checked equal, then timed in CUDA graphs (`onebit.kernels.timing.graph_us`: kernel time
without launch gaps; the logits a step just wrote sit in L2 as they do here). Prints a table of us and
GB/s of logits read.
"""

from __future__ import annotations

import argparse

import torch

from onebit.kernels import timing, triton_argmax


def main() -> None:
    """Parse, check, time, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print("| rows | torch.argmax us | Triton two-pass us | speed-up | Triton GB/s |")
    print("|---:|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, args.vocab, device="cuda").to(dtype)
        assert torch.equal(triton_argmax.argmax_rows(x), x.argmax(dim=-1)), f"{rows} rows: results differ"
        ours = timing.graph_us(lambda: triton_argmax.argmax_rows(x))
        theirs = timing.graph_us(lambda: x.argmax(dim=-1))
        print(f"| {rows} | {theirs:.1f} | {ours:.1f} | {theirs / ours:.2f}x | {x.numel() * x.element_size() / ours / 1e3:,.0f} |")


if __name__ == "__main__":
    main()
