"""FP8 weights, the first kernels against the new ones, per product and in the engine (#20).

    PYTHONPATH=. python3 bench/gpu_fp8_fast.py [--out DIR] [--rows 1,4,...] [--batches 1,8,64]

One device call, no wheels. Two parts, the table printed last:
1. Products of the Qwen3-8B shape (qkv, o, gate_up, down and the 151936-row head) at 1-256 rows,
   each timed inside a CUDA graph of 20 calls that cycle over copies of the weight larger than L2
   together (so no call finds its weight cached, as in a decode step): bf16 cuBLAS `F.linear`;
   "old", the v0.8 dispatch (`triton_fp8.weight_only` up to 64 rows, `_scaled_mm` after
   quantizing the activations with torch ops above); "new", the fastest of the candidates
   `fp8.calibrate` times (every `triton_fp8_fast.split_k` config, the first weight-only kernel,
   `_scaled_mm` after the fused Triton quantizer). Every result is checked against its
   plain-torch reference first; a wrong or failing candidate is reported and skipped.
2. Engine decode tok/s (CUDA graphs, overlapped steps, 128 prompt + 128 new tokens, random
   weights) at each batch size: bf16, `--quantize fp8` with the v0.8 dispatch (`fp8.FAST = False`)
   and with the new one (its start-up calibration's choices are printed).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import make_shape_model  # noqa: E402

from onebit.kernels import fp8, timing, triton_fp8  # noqa: E402
from onebit.kernels.timing import graph_us  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
PROMPT, NEW = 128, 128
REPLAYS = 7


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error of got against want."""
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-6)).item()


def old_choice(m: int) -> tuple[str, tuple | None]:
    """What the v0.8 dispatch ran for m rows."""
    return ("weight_only", None) if m <= fp8.MAX_WEIGHT_ONLY_ROWS else ("scaled_mm_torch", None)


def time_products(rows: list[int], notes: list[str]) -> list[str]:
    """Part 1: one table line per (product, rows)."""
    dev = torch.device("cuda")
    lines = ["| product | rows | bf16 us (TB/s) | old us (TB/s) | new us (TB/s) | new kind, config | "
             "best split_k us | scaled_mm fused / torch-quant us | new vs bf16 | new vs old |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        q, scale = fp8.quantize_rows(w)
        bf16_copies, fp8_copies = timing.weight_copies(w), timing.weight_copies(q, scale)
        gb = n * k / 1e3  # e4m3 kB: kB per us is GB/s
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            bf16_us = graph_us(timing.rotated(lambda w_: F.linear(x, w_), bf16_copies), replays=REPLAYS)
            exact = fp8.weight_only_ref(x.float(), q, scale, None)
            both = fp8.w8a8_ref(x.float(), q, scale, None)
            timed = {}
            for kind, config in fp8.candidates(m, n, k) + [old_choice(m)] + [("scaled_mm_torch", None)]:
                if (kind, config) in timed:
                    continue
                try:
                    got = fp8.run_kernel(kind, config, x, q, scale, None)
                except Exception as error:  # a config this device cannot compile is no candidate
                    notes.append(f"{name} {m} rows {kind} {config}: {type(error).__name__}: {str(error)[:200]}")
                    print(notes[-1], flush=True)
                    continue
                err = rel_err(got, both if kind.startswith("scaled_mm") else exact)
                if err > 1e-2:
                    notes.append(f"{name} {m} rows {kind} {config}: WRONG (rel. err {err:.2e})")
                    print(notes[-1], flush=True)
                    continue
                timed[(kind, config)] = graph_us(
                    timing.rotated(lambda q_, s_, kind=kind, config=config: fp8.run_kernel(kind, config, x, q_, s_, None),
                                fp8_copies), replays=REPLAYS)
            old_us = timed.get(old_choice(m), float("nan"))
            new = [c for c in timed if c in fp8.candidates(m, n, k)]
            best = min(new, key=timed.get) if new else None
            new_us = timed[best] if best else float("nan")
            split = [timed[c] for c in new if c[0] == "split_k"]
            fused, torch_q = timed.get(("scaled_mm", None)), timed.get(("scaled_mm_torch", None))
            lines.append(
                f"| {name} {n}x{k} | {m} | {bf16_us:.1f} ({2 * gb / bf16_us / 1e3:.2f}) | {old_us:.1f} "
                f"({gb / old_us / 1e3:.2f}) | {new_us:.1f} ({gb / new_us / 1e3:.2f}) | "
                f"{best[0] if best else '-'} {best[1] if best and best[1] else ''} | "
                f"{min(split) if split else float('nan'):.1f} | "
                f"{fused if fused else float('nan'):.1f} / {torch_q if torch_q else float('nan'):.1f} | "
                f"{bf16_us / new_us:.2f}x | {old_us / new_us:.2f}x |")
            print(lines[-1], flush=True)
        del w, q, scale, bf16_copies, fp8_copies
        torch.cuda.empty_cache()
    return lines


def chosen_summary() -> list[str]:
    """One line per calibrated shape: rows=choice (S split_k config, W first weight-only kernel,
    Q `_scaled_mm` with the fused quantizer)."""
    codes = {"split_k": "S", "weight_only": "W", "scaled_mm": "Q"}
    return [f"chosen {n}x{k}: " + " ".join(f"{m}={codes.get(kind, kind)}{''.join(str(config or '').split())}"
                                           for m, (kind, config) in table)
            for (n, k, _), table in fp8._CHOSEN.items()]


def engine_decode(batches: list[int], calibration: list[str], shape_name: str = "qwen3-8b",
                  device: str = "cuda") -> list[str]:
    """Part 2: one table line per engine, decode tok/s per batch size; the new engine's calibration
    lines go to `calibration`."""
    from onebit.bench.offline import run_batch
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig

    shape = make_shape_model(Path(tempfile.mkdtemp()) / "shape", shape_name)
    lines = ["| engine | " + " | ".join(f"B={b}" for b in batches) + " | build s |",
             "|---|" + "---:|" * (len(batches) + 1)]
    for label, quantize, fast in (("bf16", None, True), ("fp8 old (v0.8 dispatch)", "fp8", False),
                                  ("fp8 new (calibrated)", "fp8", True)):
        fp8.FAST = fast
        fp8.reset()
        try:
            start = time.perf_counter()
            engine = build_engine(EngineConfig(
                model=str(shape), device=device, dtype="bfloat16", parallel=max(batches),
                ctx_size=PROMPT + NEW + 16, max_batch_tokens=8192, enable_prefix_caching=False,
                load_format="dummy", cuda_graphs=True, overlap=True, quantize=quantize))
            if device == "cuda":
                torch.cuda.synchronize()
            built = time.perf_counter() - start
            if quantize and fast:
                calibration.extend(line for line in engine.runner.gemv_report if line.startswith("fp8 "))
                calibration.extend(chosen_summary())
            run_batch(engine, 4, PROMPT, 8, seed=999)  # warm-up
            speeds = []
            for b in batches:
                speeds.append(run_batch(engine, b, PROMPT, NEW, seed=b).decode_tokens_per_s)
                print(f"{label} B={b}: {speeds[-1]:,.0f} tok/s", flush=True)
            lines.append(f"| {label} | " + " | ".join(f"{s:,.0f}" for s in speeds) + f" | {built:.0f} |")
            del engine
        except Exception:
            traceback.print_exc()
            lines.append(f"| {label} | FAILED (traceback above) |")
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    fp8.FAST = True
    return lines


def main() -> None:
    """Both parts; the notes, the calibration's choices and the two tables printed last (all of it,
    with every calibration line, in DIR/fp8_fast.md)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rows", default="1,4,8,16,32,64,128,256")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--skip-products", action="store_true")
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--shape", default="qwen3-8b", help="qwen3-tiny with --device cpu --skip-products tries part 2 on a CPU")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    start = time.perf_counter()
    notes = [f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}  torch {torch.__version__}  triton "
             f"{__import__('triton').__version__}; first weight-only kernel up to {triton_fp8.MAX_ROWS} rows"]
    calibration: list[str] = []
    products = [] if args.skip_products else time_products([int(r) for r in args.rows.split(",")], notes)
    products_s = time.perf_counter() - start
    engines = [] if args.skip_engines else engine_decode([int(b) for b in args.batches.split(",")], calibration,
                                                            args.shape, args.device)
    tables = ["", f"products ({products_s:.0f} s): us per call in a CUDA graph, weights rotated past L2; "
              "TB/s of the weight bytes (bf16: 2 per weight, FP8: 1)", ""] + products + \
        ["", f"engine decode tok/s, Qwen3-8B shape, {PROMPT} + {NEW} tokens, graphs + overlap "
         f"(all {time.perf_counter() - start:.0f} s)", ""] + engines
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8_fast.md").write_text("\n".join(notes + calibration + tables) + "\n")
    skipped = [f"({len(notes) - 11} more notes in fp8_fast.md)"] if len(notes) > 11 else []
    print("\n" + "\n".join(notes[:11] + skipped + [c for c in calibration if c.startswith("chosen")] + tables))


if __name__ == "__main__":
    main()
