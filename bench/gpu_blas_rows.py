"""bf16 products at 64-512 rows on the device: cuBLAS's default path against the other ways torch can run them.

    PYTHONPATH=. python3 bench/gpu_blas_rows.py [--rows 64,128,192,256,512] [--out DIR]

Past the few-row calibration (`gemv.calibrate`, up to 64-128 rows) every bf16 product of a step is
`F.linear`, i.e. cuBLAS with its own heuristic pick. At B = 256 those products are ~7.1 of a 10.7 ms
step (session 14's profile, 580 TFLOP/s), and graph steps that carry a prompt chunk run 128-192 rows.
This times, per Qwen3-8B product shape and row count, inside CUDA graphs over rotated weight copies
(`timing.ProductTimer`, as the calibration times):

- cublas: `F.linear` as the engine runs it;
- cublaslt: the same with `torch.backends.cuda.preferred_blas_library("cublaslt")` (cuBLASLt's heuristic);
- no-reduced: cuBLAS with `allow_bf16_reduced_precision_reduction` off (other split-K choices);
- swapped: the transposed problem, `(w @ x.T).T` made contiguous (the weight as the long operand).

Each result is checked against cublas's (relative error at most 1e-2) before it is timed. Printed last:
per row count, a step's products in ms (36 layers of qkv, o, gate_up, down plus the head) for each way
and for the best way per product, and TFLOP/s. Writes blas_rows.json into --out. On the CPU
(`--device cpu`, a tiny shape) only the mechanics run: cublas and swapped, timed without graphs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from onebit.kernels import gemv
from onebit.kernels.timing import ProductTimer, graph_us

# (name, N, K, times a step): Qwen3-8B, 36 layers, untied 151,936-token head
SHAPES = {
    "qwen3-8b": [("qkv", 6144, 4096, 36), ("o", 4096, 4096, 36), ("gate_up", 24576, 4096, 36),
                 ("down", 4096, 12288, 36), ("head", 151936, 4096, 1)],
    "tiny": [("qkv", 192, 128, 4), ("o", 128, 128, 4), ("gate_up", 512, 128, 4), ("down", 128, 256, 4),
             ("head", 1024, 128, 1)],
}


@contextlib.contextmanager
def without_reduced_precision_reduction():
    """cuBLAS's bf16 products inside without the reduced-precision reduction (the setting restored after)."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def product(way: str, x: torch.Tensor):
    """fn(w) computing x @ w.T the given way (cublaslt: as the engine dispatches a cuBLASLt pick)."""
    if way == "swapped":
        return lambda w: torch.mm(w, x.t()).t().contiguous()
    if way == "cublaslt":
        return lambda w: gemv.run_choice(gemv.CUBLASLT, x, w, None)

    def run(w):
        with without_reduced_precision_reduction() if way == "no-reduced" else contextlib.nullcontext():
            return F.linear(x, w)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="64,128,192,256,512")
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ways = ["cublas", "cublaslt", "no-reduced", "swapped"] if device.type == "cuda" else ["cublas", "swapped"]
    rows = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator(device="cpu").manual_seed(0)
    records = []
    for name, n, k, count in SHAPES[args.shape]:
        w = (torch.randn(n, k, generator=gen) * 0.02).to(device, dtype)
        timer = ProductTimer(w) if device.type == "cuda" else None
        for m in rows:
            x = torch.randn(m, k, generator=gen).to(device, dtype)
            want = F.linear(x, w).float()
            us, errors = {}, {}
            for way in ways:
                got = product(way, x)(w).float()
                errors[way] = ((got - want).norm() / want.norm()).item()
                if errors[way] > 1e-2:
                    print(f"{name} {m} rows: {way} off by {errors[way]:.1e}; not timed")
                    continue
                fn = product(way, x)
                us[way] = timer.us(fn) if timer else graph_us(lambda fn=fn: fn(w), replays=3, clock=_HostClock)
            records.append(dict(product=name, n=n, k=k, count=count, rows=m, us=us, rel_err=errors))
            best = min(us, key=us.get)
            print(f"{name} {n}x{k} {m} rows: " + ", ".join(f"{way} {t:.1f}" for way, t in us.items())
                  + f" us; best {best} ({us['cublas'] / us[best]:.2f}x cublas, "
                  f"{2 * m * n * k / us[best] / 1e6:.0f} TFLOP/s)", flush=True)
        if timer:
            timer.close()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "blas_rows.json").write_text(json.dumps(dict(shape=args.shape, records=records), indent=1))
    print_summary(records, rows, ways, SHAPES[args.shape])
    return 0


def print_summary(records: list[dict], rows: list[int], ways: list[str], shapes) -> None:
    """Per row count: a step's products (ms) each way and with the best way per product."""
    flops_per_row = sum(2 * n * k * count for _, n, k, count in shapes)
    print("\n| rows | " + " | ".join(ways) + " | best per product | best TFLOP/s | gain over cublas |")
    print("|---:|" + "---:|" * (len(ways) + 3))
    for m in rows:
        mine = [r for r in records if r["rows"] == m]
        step = {way: sum(r["us"].get(way, math.inf) * r["count"] for r in mine) / 1000 for way in ways}
        best = sum(min(r["us"].values()) * r["count"] for r in mine) / 1000
        print(f"| {m} | " + " | ".join(f"{step[w]:.2f}" for w in ways)
              + f" | {best:.2f} | {flops_per_row * m / best / 1e9:.0f} | {step['cublas'] / best:.3f}x |")


class _HostClock:
    """`graph_us`'s clock on the CPU: no graph, host time."""

    @staticmethod
    def synchronize() -> None:
        """Nothing to wait for."""

    @staticmethod
    def capture(fn, reps: int):
        """No capture off CUDA: graph_us times single calls."""
        raise RuntimeError("no CUDA graphs here")

    @staticmethod
    def elapsed_ms(run) -> float:
        """Host milliseconds of one call."""
        import time
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1000


if __name__ == "__main__":
    raise SystemExit(main())
