"""FP8 weights, the first kernels against the new ones, per product and in the engine (#20).

    PYTHONPATH=. python3 bench/gpu_fp8_fast.py [--out DIR] [--rows 1,4,...] [--batches 1,8,64]
        [--engines bf16,fp8,fp8-head,...] [--accum-rows 32,...] [--fused-rows 1,...]

One device call, no wheels. Four parts, the tables printed last:
1. Products of the Qwen3-8B shape (qkv, o, gate_up, down and the 151936-row head) at 1-256 rows,
   each timed inside a CUDA graph of 20 calls that cycle over copies of the weight larger than L2
   together (so no call finds its weight cached, as in a decode step): bf16 cuBLAS `F.linear`;
   "old", the v0.8 dispatch (`triton_fp8.weight_only` up to 64 rows, `_scaled_mm` after
   quantizing the activations with torch ops above); "new", the fastest of the candidates
   `fp8.calibrate` times (every `triton_fp8_fast.split_k` config, the first weight-only kernel,
   `_scaled_mm` after the fused Triton quantizer). Every result is checked against its
   plain-torch reference first; a wrong or failing candidate is reported and skipped.
2. `_scaled_mm` on rows already in e4m3 with `use_fast_accum` on and off (`fp8.FAST_ACCUM`), per
   decoder product and row count: us, and the relative error of each against the float32 product
   of the same e4m3 operands (what the accumulation alone loses; the bf16 output adds ~2e-3).
3. The producers of a product's FP8 input: add + RMSNorm (hidden 4096) and SiLU * mul (12288),
   each plain (bf16 out, what split_k reads), then the one-pass quantizer after it (what ran so
   far before `_scaled_mm`), and fused into one kernel (`triton_fp8_fused`), checked against the
   references.
4. Engine decode tok/s (CUDA graphs, overlapped steps, 128 prompt + 128 new tokens, random
   weights) at each batch size, per engine of `--engines`: bf16; fp8-v08 (the v0.8 dispatch,
   `fp8.FAST = False`); fp8 (calibrated, head bf16, separate quantizer: G18's "fp8 new");
   fp8-head (the output head in FP8 too); fp8-head-fused (and the norms / SiLU * mul emitting e4m3
   rows); fp8-head-fused-accurate (the same with `use_fast_accum=False`). The calibration's
   choices of the last FP8 engine are printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import make_shape_model  # noqa: E402

from onebit.kernels import fp8, timing, triton_fp8, triton_fp8_fast, triton_fp8_fused, triton_fused  # noqa: E402
from onebit.kernels.timing import graph_us  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
HIDDEN, INTERMEDIATE = 4096, 12288
# name -> (quantize, fp8.FAST, quantize_lm_head, fp8.FUSE_QUANT, fp8.FAST_ACCUM)
ENGINES = {"bf16": (None, True, False, False, True), "fp8-v08": ("fp8", False, False, False, True),
           "fp8": ("fp8", True, False, False, True), "fp8-head": ("fp8", True, True, False, True),
           "fp8-head-fused": ("fp8", True, True, True, True),
           "fp8-head-fused-accurate": ("fp8", True, True, True, False)}
PROMPT, NEW = 128, 128
REPLAYS = 7


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative Frobenius error of got against want."""
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-6)).item()


def old_choice(m: int) -> tuple[str, tuple | None]:
    """What the v0.8 dispatch ran for m rows."""
    return ("weight_only", None) if m <= fp8.MAX_WEIGHT_ONLY_ROWS else ("scaled_mm_torch", None)


def time_products(rows: list[int], notes: list[str], shapes: list[str] | None = None) -> list[str]:
    """Part 1: one table line per (product, rows)."""
    dev = torch.device("cuda")
    lines = ["| product | rows | bf16 us (TB/s) | old us (TB/s) | new us (TB/s) | new kind, config | "
             "best split_k us | best split_k_w8a8 us | scaled_mm fused / torch-quant us | new vs bf16 | new vs old |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for name, (n, k) in SHAPES.items():
        if shapes and name not in shapes:
            continue
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        q, scale = fp8.quantize_rows(w)
        bf16_copies, fp8_copies = timing.weight_copies(w), timing.weight_copies(q, scale)
        gb = n * k / 1e3  # e4m3 kB: kB per us is GB/s
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            bf16_us = graph_us(timing.rotated(lambda w_: F.linear(x, w_), bf16_copies), replays=REPLAYS)
            exact = fp8.weight_only_ref(x.float(), q, scale, None)
            both = fp8.w8a8_ref(x.float(), q, scale, None)
            blocks = fp8.w8a8_blocks_ref(x.float(), q, scale, None)
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
                err = rel_err(got, both if kind in fp8.W8A8_KINDS else blocks if kind == fp8.BLOCK_W8A8_KIND else exact)
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
            split_w8a8 = [timed[c] for c in new if c[0] == "split_k_w8a8"]
            fused, torch_q = timed.get(("scaled_mm", None)), timed.get(("scaled_mm_torch", None))
            lines.append(
                f"| {name} {n}x{k} | {m} | {bf16_us:.1f} ({2 * gb / bf16_us / 1e3:.2f}) | {old_us:.1f} "
                f"({gb / old_us / 1e3:.2f}) | {new_us:.1f} ({gb / new_us / 1e3:.2f}) | "
                f"{best[0] if best else '-'} {best[1] if best and best[1] else ''} | "
                f"{min(split) if split else float('nan'):.1f} | "
                f"{min(split_w8a8) if split_w8a8 else float('nan'):.1f} | "
                f"{fused if fused else float('nan'):.1f} / {torch_q if torch_q else float('nan'):.1f} | "
                f"{bf16_us / new_us:.2f}x | {old_us / new_us:.2f}x |")
            print(lines[-1], flush=True)
        del w, q, scale, bf16_copies, fp8_copies
        torch.cuda.empty_cache()
    return lines


def time_accumulation(rows: list[int], notes: list[str]) -> list[str]:
    """Part 2: `_scaled_mm` with use_fast_accum on and off, one line per (decoder product, rows)."""
    dev = torch.device("cuda")
    lines = ["| product | rows | fast accum us | accurate us | fast / accurate | fast rel. err | accurate rel. err |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, (n, k) in SHAPES.items():
        if name == "lm_head":
            continue
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        q, scale = fp8.quantize_rows(w)
        copies = timing.weight_copies(q, scale)
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            xin = fp8.Fp8Rows(*triton_fp8_fast.quantize_rows(x), x.dtype)
            want = (xin.q.double() @ q.double().t()) * xin.scale.double() * scale.double()[None, :]  # exact
            us, err = {}, {}
            for fast in (True, False):
                fp8.FAST_ACCUM = fast
                try:
                    err[fast] = rel_err(fp8.scaled_mm_quantized(xin, q, scale, None), want)
                    us[fast] = graph_us(timing.rotated(lambda q_, s_: fp8.scaled_mm_quantized(xin, q_, s_, None), copies),
                                        replays=REPLAYS)
                except Exception as error:
                    notes.append(f"accum {name} {m} rows fast={fast}: {type(error).__name__}: {str(error)[:200]}")
                    print(notes[-1], flush=True)
                    us[fast] = err[fast] = float("nan")
            fp8.FAST_ACCUM = True
            lines.append(f"| {name} {n}x{k} | {m} | {us[True]:.1f} | {us[False]:.1f} | {us[True] / us[False]:.2f} | "
                         f"{err[True]:.2e} | {err[False]:.2e} |")
            print(lines[-1], flush=True)
        del w, q, scale, copies
        torch.cuda.empty_cache()
    return lines


def _quantization_error(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> str:
    """Relative error of the dequantized rows against the reference's, and the share of e4m3 codes that
    differ (scales per row, or per row and block of fp8.ACTIVATION_BLOCK values)."""
    def values(q, s):
        return fp8.dequantize_row_blocks(q, s) if s.shape[1] > 1 else q.float() * s.view(-1, 1)
    a, b = values(*got), values(*want)
    return f"{rel_err(a, b):.1e}, {(got[0].float() != want[0].float()).float().mean().item():.1e}"


def time_producers(rows: list[int], notes: list[str]) -> list[str]:
    """Part 3: add + RMSNorm and SiLU * mul, plain, followed by the quantizer, and fused; one line per rows."""
    dev = torch.device("cuda")
    lines = ["| producer | rows | plain us | + separate quantizer us | fused us | fused vs separate | "
             "fused err vs ref (rel., codes differing) |", "|---|---:|---:|---:|---:|---:|---|"]
    w = torch.rand(HIDDEN, device=dev, dtype=torch.bfloat16) + 0.5
    for m in rows:
        x = torch.randn(m, HIDDEN, device=dev, dtype=torch.bfloat16)
        res = torch.randn(m, HIDDEN, device=dev, dtype=torch.bfloat16)
        gate_up = torch.randn(m, 2 * INTERMEDIATE, device=dev, dtype=torch.bfloat16) * 2
        cases = {
            "add + RMSNorm 4096": (lambda: triton_fused.add_rms_norm(x, res, w, 1e-6),
                                   lambda: triton_fp8_fast.quantize_rows(triton_fused.add_rms_norm(x, res, w, 1e-6)[0]),
                                   lambda: triton_fp8_fused.add_rms_norm_quantize(x, res, w, 1e-6),
                                   lambda: fp8.add_rms_norm_quantize_ref(x, res, w, 1e-6)[:2]),
            "SiLU * mul 12288": (lambda: triton_fused.silu_mul(gate_up),
                                 lambda: triton_fp8_fast.quantize_row_blocks(triton_fused.silu_mul(gate_up),
                                                                             fp8.ACTIVATION_BLOCK),
                                 lambda: triton_fp8_fused.silu_mul_quantize(gate_up, fp8.ACTIVATION_BLOCK),
                                 lambda: fp8.silu_mul_quantize_ref(gate_up)),
        }
        for name, (plain, separate, fused, ref) in cases.items():
            try:
                check = _quantization_error(fused()[:2], ref())
                times = [graph_us(fn, replays=REPLAYS) for fn in (plain, separate, fused)]
            except Exception as error:
                notes.append(f"producer {name} {m} rows: {type(error).__name__}: {str(error)[:200]}")
                print(notes[-1], flush=True)
                continue
            lines.append(f"| {name} | {m} | {times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} | "
                         f"{times[1] / times[2]:.2f}x | {check} |")
            print(lines[-1], flush=True)
    return lines


def chosen_summary() -> list[str]:
    """One line per calibrated shape: rows=choice (S split_k config, W first weight-only kernel,
    Q `_scaled_mm` with the fused quantizer); "e4m3 in": the table of products fed e4m3 rows."""
    codes = {"split_k": "S", "weight_only": "W", "scaled_mm": "Q"}
    return [f"chosen {n}x{k}{label}: " + " ".join(f"{m}={codes.get(kind, kind)}{''.join(str(config or '').split())}"
                                                  for m, (kind, config) in table)
            for label, chosen in (("", fp8._CHOSEN), (" e4m3 in", fp8._CHOSEN_QUANTIZED_INPUT))
            for (n, k, *_), table in chosen.items()]


def engine_decode(batches: list[int], calibration: list[str], shape_name: str = "qwen3-8b",
                  device: str = "cuda", engines: list[str] | None = None) -> list[str]:
    """Part 4: one table line per engine of `engines` (names of ENGINES), decode tok/s per batch
    size; the last calibrated engine's calibration lines go to `calibration`."""
    from onebit.bench.offline import engine_speed_row
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig

    shape = make_shape_model(Path(tempfile.mkdtemp()) / "shape", shape_name)
    lines = ["| engine | " + " | ".join(f"B={b}" for b in batches) + " | build s |",
             "|---|" + "---:|" * (len(batches) + 1)]
    defaults = fp8.FAST, fp8.FUSE_QUANT, fp8.FAST_ACCUM
    for label in engines or list(ENGINES):
        quantize, fast, head, fuse, fast_accum = ENGINES[label]
        fp8.FAST, fp8.FUSE_QUANT, fp8.FAST_ACCUM = fast, fuse, fast_accum
        fp8.reset()
        config = EngineConfig(
            model=str(shape), device=device, dtype="bfloat16", parallel=max(batches),
            ctx_size=PROMPT + NEW + 16, max_batch_tokens=8192, enable_prefix_caching=False,
            load_format="dummy", cuda_graphs=True, overlap=True, quantize=quantize, quantize_lm_head=head)

        def report_calibration(engine, label=label):
            calibration.clear()
            calibration.append(f"calibration of engine {label}:")
            calibration.extend(line for line in engine.runner.gemv_report if line.startswith("fp8 "))
            calibration.extend(chosen_summary())

        lines.append(engine_speed_row(label, lambda config=config: build_engine(config), batches, PROMPT, NEW,
                                      report_calibration if quantize and fast else None))
    fp8.FAST, fp8.FUSE_QUANT, fp8.FAST_ACCUM = defaults
    return lines


def main() -> None:
    """Both parts; the notes, the calibration's choices and the two tables printed last (all of it,
    with every calibration line, in DIR/fp8_fast.md)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rows", default="1,4,8,16,32,64,128,256")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="products of part 1, from: " + ", ".join(SHAPES))
    ap.add_argument("--accum-rows", default="32,64,128,256", help="part 2's row counts ('' skips it)")
    ap.add_argument("--fused-rows", default="1,8,32,64,128,256", help="part 3's row counts ('' skips it)")
    ap.add_argument("--engines", default="bf16,fp8,fp8-head,fp8-head-fused,fp8-head-fused-accurate", help="part 4's engines, from: " + ", ".join(ENGINES))
    ap.add_argument("--skip-products", action="store_true")
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--shape", default="qwen3-8b", help="qwen3-tiny with --device cpu --skip-products tries part 2 on a CPU")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    start = time.perf_counter()
    notes = [f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}  torch {torch.__version__}  triton "
             f"{__import__('triton').__version__}; first weight-only kernel up to {triton_fp8.MAX_ROWS} rows"]
    calibration: list[str] = []
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    products = [] if args.skip_products else time_products(ints(args.rows), notes, args.shapes.split(","))
    products_s = time.perf_counter() - start
    accum = time_accumulation(ints(args.accum_rows), notes) if args.device == "cuda" and args.accum_rows else []
    producers = time_producers(ints(args.fused_rows), notes) if args.device == "cuda" and args.fused_rows else []
    kernels_s = time.perf_counter() - start
    engines = [] if args.skip_engines else engine_decode(ints(args.batches), calibration, args.shape, args.device,
                                                            args.engines.split(","))
    tables = ["", f"products ({products_s:.0f} s): us per call in a CUDA graph, weights rotated past L2; "
              "TB/s of the weight bytes (bf16: 2 per weight, FP8: 1)", ""] + products + \
        (["", "_scaled_mm on e4m3 rows, use_fast_accum on / off (err: against the float32 product of the same "
          "e4m3 operands)", ""] + accum if accum else []) + \
        (["", f"producers of the FP8 input, us in a CUDA graph (parts 1-3: {kernels_s:.0f} s)", ""] + producers
         if producers else []) + \
        ["", f"engine decode tok/s, Qwen3-8B shape, {PROMPT} + {NEW} tokens, graphs + overlap "
         f"(all {time.perf_counter() - start:.0f} s)", ""] + engines
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8_fast.md").write_text("\n".join(notes + calibration + tables) + "\n")
    skipped = [f"({len(notes) - 11} more notes in fp8_fast.md)"] if len(notes) > 11 else []
    print("\n" + "\n".join(notes[:11] + skipped + [c for c in calibration if c.startswith("chosen")] + tables))


if __name__ == "__main__":
    main()
