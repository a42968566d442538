"""Packed GGUF weights on the GPU: kernel checks and timings, then the engine on Q4_K_M and Q8_0 files.

    PYTHONPATH=. python3 bench/gpu_gguf_quant.py --out DIR [--shape qwen3-8b] [--skip-kernels]
    PYTHONPATH=. python3 bench/gpu_gguf_quant.py --out DIR --device cpu --shape qwen3-tiny   # CPU try-out
    PYTHONPATH=. python3 bench/gpu_gguf_quant.py --out DIR --few-rows-only   # the few-row kernel sweep only

0. --few-rows-only: Q4_K, Q6_K, Q8_0 at the 8B products and the head (151936x4096), 1/4/8/16 rows: the
   tile kernel (DEFAULT_CONFIG), every triton_gguf.FEW_ROWS_CONFIGS variant of the second design
   (`matmul_few_rows`; the CUDA-core "gemv" ones up to 8 rows) and bf16 cuBLAS, timed inside CUDA
   graphs; TB/s of the packed bytes; every variant's relative error against the float32 product with
   the dequantized weight; then per config the geometric-mean speed-up vs bf16 per row count and the
   best config per row count (DIR/few_rows.md, DIR/few_rows.json).

1. Kernels: for each product of the Qwen3-8B layers and each packed type (Q8_0, Q4_K, Q5_K, Q6_K),
   random weights (Q8_0/Q4_K/Q6_K encoded from random bf16 by onebit.testing.gguf_encode; Q5_K
   random blocks), rows 1/4/8/16/64/256: the Triton product against the torch reference (dequantize,
   float32 product): max abs and relative error; time inside a CUDA graph (onebit.kernels.timing)
   of the default config, the best of triton_gguf.CONFIGS (Q4_K only, 1-64 rows), and bf16 cuBLAS
   on the dequantized weight; weight bytes per second.
2. Engine: the 8B shape's random weights (our dummy loader, the same weights `--load-format dummy`
   gives) written as GGUF Q4_K_M (llama.cpp's recipe: Q6_K for the head and for attn_v/ffn_down of
   some layers, Q4_K elsewhere; encoders: round to nearest, no scale search) and Q8_0. Each served
   in a fresh child: the original bf16 weights (dummy load), each file packed, the Q4_K_M file
   dequantized to bf16 at load, and (`--runs fp8`, not by default) the original weights under
   `--quantize fp8` with the head in FP8 too. Per run: logits of a fixed 64-token prompt, decode tok/s at
   B = 1, 8, 32, 64 (128-token prompts, 64 new tokens; the time of a 1-token run subtracted).
   Logit errors: against the original bf16 weights (quantization + kernels) and, for the packed
   Q4_K_M, against the same file dequantized (the kernels alone).
Results in DIR/gguf_quant.json and DIR/gguf_quant.md (the model files go to --work, default
$TMPDIR/gguf_quant: ~14 GB); the tables are printed last. On the device (carry .whl, see
tools/device_wheels.sh: the device lacks gguf and the server's packages):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && PYTHONPATH=/tmp/site:. TQDM_DISABLE=1 python3 bench/gpu_gguf_quant.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import torch

PROBE = list(range(100, 164))
PRODUCTS = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
            "down_proj": (4096, 12288)}
ROWS = (1, 4, 8, 16, 64, 256)
BATCHES = (1, 8, 32, 64)


def random_packed(qtype: str, n: int, k: int, device: torch.device):
    """A PackedMatrix of random weights (encoded from random bf16; Q5_K: random blocks, scaled d)."""
    from onebit.kernels.gguf_quants import LAYOUTS, PackedMatrix
    from onebit.testing.gguf_encode import ENCODERS

    if qtype in ENCODERS:
        w = torch.randn(n, k, device=device) * k ** -0.5
        return PackedMatrix.from_blocks(ENCODERS[qtype](w), qtype, k)
    layout = LAYOUTS[qtype]
    nb = k // layout.values
    raw = torch.randint(0, 256, (n, nb, layout.nbytes), dtype=torch.uint8, device=device)
    d = (torch.randn(n, nb, layout.d_count, device=device) * 1e-3).half().view(torch.uint8).reshape(n, nb, -1)
    raw[..., layout.d[0]:layout.d[1]] = d
    return PackedMatrix.from_blocks(raw.reshape(n, -1), qtype, k)


def kernel_table() -> list[str]:
    """Check and time the kernels at the 8B products; markdown lines."""
    import torch.nn.functional as F

    from onebit.kernels import triton_gguf
    from onebit.kernels.timing import graph_us

    dev = torch.device("cuda")
    lines = ["| product | type | rows | max abs err | rel err | default us (TB/s) | best us (config) | "
             "bf16 cuBLAS us | speed-up vs bf16 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, (n, k) in PRODUCTS.items():
        for qtype in ("Q4_K", "Q6_K", "Q8_0", "Q5_K"):
            w = random_packed(qtype, n, k, dev)
            dense = w.dequantize(torch.float32)
            dense16 = dense.to(torch.bfloat16)
            for m in ROWS:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                want = x.float() @ dense.t()
                got = triton_gguf.matmul(x, w).float()
                max_err = (got - want).abs().max().item()
                rel = ((got - want).norm() / want.norm()).item()
                default_us = graph_us(lambda: triton_gguf.matmul(x, w))
                best = ""
                if qtype == "Q4_K" and m <= 64:
                    timed = {c: graph_us(lambda: triton_gguf.matmul(x, w, config=c)) for c in triton_gguf.CONFIGS}
                    c = min(timed, key=timed.get)
                    best = f"{timed[c]:.1f} {c}"
                bf16_us = graph_us(lambda: F.linear(x, dense16))
                lines.append(f"| {name} {n}x{k} | {qtype} | {m} | {max_err:.2e} | {rel:.1e} | {default_us:.1f} "
                             f"({w.nbytes / default_us / 1e6:.2f}) | {best} | {bf16_us:.1f} | "
                             f"{bf16_us / default_us:.2f}x |")
                print(lines[-1], flush=True)
    return lines


FEW_ROWS_PRODUCTS = dict(PRODUCTS, lm_head=(151936, 4096))
FEW_ROWS = (1, 4, 8, 16)


def few_rows_table(out: Path, device: str = "cuda", timer=None) -> list[str]:
    """Old tile kernel vs every triton_gguf.FEW_ROWS_CONFIGS variant vs bf16 cuBLAS at 1/4/8/16 rows, for
    Q4_K, Q6_K, Q8_0 at the 8B products and the head; every variant checked against the float32
    product with the dequantized weight. Markdown lines (also DIR/few_rows.json)."""
    import math

    import torch.nn.functional as F

    from onebit.kernels import triton_gguf
    from onebit.kernels.timing import graph_us

    dev = torch.device(device)
    timer = timer or graph_us
    configs = triton_gguf.FEW_ROWS_CONFIGS
    records = []
    lines = ["| product | type | rows | tile kernel us (TB/s) | best new us (TB/s) | best new config | "
             "bf16 cuBLAS us (TB/s) | new vs bf16 | new vs tile | worst rel err (config) |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for name, (n, k) in FEW_ROWS_PRODUCTS.items():
        for qtype in ("Q4_K", "Q6_K", "Q8_0"):
            w = random_packed(qtype, n, k, dev)
            dense = w.dequantize(torch.float32)
            dense16 = dense.to(torch.bfloat16)
            tb = w.nbytes / 1e6  # bytes / us / 1e6 = TB/s
            for m in FEW_ROWS:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                want = x.float() @ dense.t()
                tile = triton_gguf.FEW_ROWS_CONFIG if m <= 4 else triton_gguf.DEFAULT_CONFIG  # its own default
                rec = {"product": name, "n": n, "k": k, "qtype": qtype, "rows": m, "bytes": w.nbytes,
                       "tile_us": timer(lambda: triton_gguf.matmul(x, w, config=tile)),
                       "bf16_us": timer(lambda: F.linear(x, dense16)), "new_us": {}, "rel_err": {}}
                for label, config in configs.items():
                    if config.kernel == "gemv" and m > 8:
                        continue
                    try:
                        got = triton_gguf.matmul_few_rows(x, w, config=config).float()
                        rec["rel_err"][label] = ((got - want).norm() / want.norm()).item()
                        rec["new_us"][label] = timer(lambda: triton_gguf.matmul_few_rows(x, w, config=config))
                    except Exception as err:  # a launch failure (resources) is a result, not a crash
                        rec["new_us"][label] = float("nan")
                        rec["rel_err"][label] = float("nan")
                        print(f"{name} {qtype} {m} {label}: {type(err).__name__}: {str(err)[:200]}", flush=True)
                records.append(rec)
                timed = {c: t for c, t in rec["new_us"].items() if not math.isnan(t)}
                best = min(timed, key=timed.get) if timed else None
                worst = max(rec["rel_err"], key=lambda c: rec["rel_err"][c] if not math.isnan(rec["rel_err"][c]) else -1)
                b_us = timed.get(best, float("nan"))
                lines.append(f"| {name} {n}x{k} | {qtype} | {m} | {rec['tile_us']:.1f} ({tb / rec['tile_us']:.2f}) | "
                             f"{b_us:.1f} ({tb / b_us:.2f}) | {best} | {rec['bf16_us']:.1f} "
                             f"({n * k * 2 / 1e6 / rec['bf16_us']:.2f}) | {rec['bf16_us'] / b_us:.2f}x | "
                             f"{rec['tile_us'] / b_us:.2f}x | {rec['rel_err'][worst]:.1e} ({worst}) |")
                print(lines[-1], flush=True)
            del w, dense, dense16
            torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "few_rows.json").write_text(json.dumps(records, indent=1))
    # Per config and row count: geometric mean over products and types of (bf16 us / config us); the
    # best per row count is the FEW_ROWS_DEFAULT candidate.
    lines += ["", "Per config: geometric mean of the speed-up vs bf16 cuBLAS over products and types (n/a: not run)",
              "", "| config | " + " | ".join(f"{m} rows" for m in FEW_ROWS) + " |", "|---|" + "---:|" * len(FEW_ROWS)]
    means = {}
    for label in configs:
        row = []
        for m in FEW_ROWS:
            ratios = [r["bf16_us"] / r["new_us"][label] for r in records
                      if r["rows"] == m and label in r["new_us"] and not math.isnan(r["new_us"][label])]
            means[label, m] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
            row.append(f"{means[label, m]:.2f}x" if ratios else "n/a")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    tile = [math.exp(sum(math.log(r["bf16_us"] / r["tile_us"]) for r in records if r["rows"] == m)
                     / sum(r["rows"] == m for r in records)) for m in FEW_ROWS]
    lines.append("| tile kernel (its default config) | " + " | ".join(f"{t:.2f}x" for t in tile) + " |")
    picks = {m: max((c for c in configs if not math.isnan(means[c, m])), key=lambda c: means[c, m]) for m in FEW_ROWS}
    lines += ["", "Best config per row count (FEW_ROWS_DEFAULT candidates): "
              + ", ".join(f"{m}: {picks[m]} ({means[picks[m], m]:.2f}x)" for m in FEW_ROWS)]
    return lines


def write_quantized(model, shape_dir: Path, out: Path, recipe: str) -> Path:
    """Write the dummy-loaded `model` as GGUF: recipe "Q4_K_M" or "Q8_0" (vectors F32)."""
    from onebit.testing.gguf_encode import encode, q4_k_m_type

    from bench.gpu_gguf import write_model_gguf

    c = json.loads((shape_dir / "config.json").read_text())

    def matrix(name, t):
        qtype = q4_k_m_type(name, t.shape[1], c["num_hidden_layers"], c["tie_word_embeddings"]) \
            if recipe == "Q4_K_M" else "Q8_0"
        return encode(t, qtype), gguf.GGMLQuantizationType[qtype], None

    return write_model_gguf(model, shape_dir, out, {"Q4_K_M": 15, "Q8_0": 7}[recipe], matrix)


def write_gguf_files(shape_dir: Path, out_dir: Path, recipes: list[str], device: str) -> dict[str, Path]:
    """The shape model's random weights (load format "dummy") written once per recipe as
    out_dir/model-RECIPE.gguf (`write_quantized`); {recipe: path}."""
    from onebit.models.loader import load_model

    model, _ = load_model(shape_dir, torch.device(device), torch.bfloat16, "dummy")
    files = {recipe: write_quantized(model, shape_dir, out_dir / f"model-{recipe}.gguf", recipe) for recipe in recipes}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return files


def child(model: str, keep_packed: str, logits_out: Path, dummy: bool, device: str, batches: list[int],
          quantize: str | None = None, calibrate_only: bool = False) -> None:
    """In a fresh process: load (`quantize`: "fp8" for `--quantize fp8`, the head too), record logits of
    PROBE and decode tok/s at each batch size; with `calibrate_only`, only the start-up (which times the
    products into the calibration cache, or restores them from it)."""
    from bench.gpu_gguf import decode_tok_s
    from onebit import LLM
    from tests.model_probe import all_logits

    start = time.perf_counter()
    options = {"load_format": "dummy"} if dummy else {"gguf_keep_packed": keep_packed == "1"}
    if quantize:
        options.update(quantize=quantize, quantize_lm_head=True)
    llm = LLM(model, device=device, parallel=max(batches), ctx_size=512, dtype="bfloat16", **options)
    record = {"start_s": time.perf_counter() - start,
              "gpu_gb": torch.cuda.memory_allocated() / 2**30 if device == "cuda" else float("nan"),
              "calibration_source": llm.engine.runner.calibration_source}  # "timed", or "cache" (no timing ran)
    if calibrate_only:
        print(json.dumps(record))
        return
    torch.save(all_logits(llm, PROBE).float().cpu(), logits_out)
    record["clocks"] = {}  # the GPU's clock, power and slowdowns while each batch size was timed
    record["gc_pauses"] = {}  # the garbage collector's collections and pauses while each batch size was timed
    record["decode_tok_s"] = decode_tok_s(llm, batches, clocks=record["clocks"], gc_pauses=record["gc_pauses"])
    from onebit.kernels import fp8, gemv  # the calibrations' picks per product shape and row count
    record["fp8_picks"], record["bf16_picks"] = fp8.picks(), gemv.picks()
    record["startup_s"] = llm.engine.runner.startup_s
    # each product's calibration line (us and TB/s of every kind) at the batch sizes timed here
    record["calibration"] = [line for line in llm.engine.runner.gemv_report
                             if any(f", {b} row(s):" in line for b in batches)]
    print(json.dumps(record))


def run_child(model: Path, keep_packed: bool, logits: Path, dummy: bool, device: str, batches: list[int],
              quantize: str | None = None, calibrate_only: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", str(model), "--packed", "1" if keep_packed else "0",
           "--logits", str(logits), "--device", device, "--batches", ",".join(map(str, batches))] + \
        (["--dummy"] if dummy else []) + (["--quantize", quantize] if quantize else []) + \
        (["--calibrate-only"] if calibrate_only else [])
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode:
        raise SystemExit(f"child failed on {model}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


RUN_NAMES = {"bf16": "bf16 (original weights)", "q4km-packed": "Q4_K_M packed",
             "q4km-dequantized": "Q4_K_M dequantized to bf16", "q8-packed": "Q8_0 packed",
             "fp8": "FP8 (--quantize fp8, head too)"}


def engine_table(out: Path, work_root: Path, shape: str, device: str, batches: list[int],
                 chosen: tuple[str, ...] = tuple(k for k in RUN_NAMES if k != "fp8"),
                 calibrate_only: bool = False) -> list[str]:
    """Write the files (under work_root), serve each chosen run (`RUN_NAMES` keys) in a child, compare
    logits (under out; errors left out where a run they need was not chosen); markdown lines. With
    `calibrate_only` each child only starts (its products timed into the calibration cache, or restored)."""
    from bench.make_shape_model import fill_vocab, make_shape_model

    work = work_root / "model"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    make_shape_model(work, shape)
    fill_vocab(work)
    start = time.perf_counter()
    types = [t for t, keys in (("Q4_K_M", ("q4km-packed", "q4km-dequantized")), ("Q8_0", ("q8-packed",)))
             if any(key in chosen for key in keys)]
    files = write_gguf_files(work, work_root, types, device)
    print(f"wrote the GGUF files in {time.perf_counter() - start:.0f} s", flush=True)
    every = {"bf16": (work, False, True, None), "q4km-packed": (files.get("Q4_K_M"), True, False, None),
             "q4km-dequantized": (files.get("Q4_K_M"), False, False, None),
             "q8-packed": (files.get("Q8_0"), True, False, None), "fp8": (work, False, True, "fp8")}
    runs = {RUN_NAMES[key]: every[key] for key in RUN_NAMES if key in chosen}
    results, logits = {}, {}
    for label, (path, packed, dummy, quantize) in runs.items():
        slug = label.split(" (")[0].replace(" ", "_")
        results[label] = run_child(path, packed, out / f"logits-{slug}.pt", dummy, device, batches, quantize,
                                   calibrate_only)
        if not calibrate_only:
            logits[label] = torch.load(out / f"logits-{slug}.pt")
        print(label, json.dumps(results[label]), flush=True)
    if calibrate_only:
        return ["| run | start s | calibration |", "|---|---:|---|"] + [
            f"| {label} | {r['start_s']:.1f} | {r['calibration_source']} |" for label, r in results.items()]
    ref = logits.get("bf16 (original weights)")

    def rms(a, b):
        return (a - b).pow(2).mean().sqrt().item() if a is not None and b is not None else float("nan")

    (out / "gguf_quant.json").write_text(json.dumps(results, indent=1))
    std = f"{ref.std():.2f}" if ref is not None else "(no bf16 run)"
    lines = [f"Engine, {shape}, random weights; decode tok/s (128-token prompts, 64 new); logits std {std}", "",
             "| run | file GB | GPU GB | logit RMS err vs bf16 | " + " | ".join(f"B={b}" for b in batches) + " |",
             "|---|---:|---:|---:|" + "---:|" * len(batches)]
    for label, r in results.items():
        path = runs[label][0]
        size = path.stat().st_size / 2**30 if path.is_file() else float("nan")
        d = r["decode_tok_s"]
        lines.append(f"| {label} | {size:.2f} | {r['gpu_gb']:.1f} | {rms(logits.get(label), ref):.4f} | "
                     + " | ".join(str(d[str(b)]) for b in batches) + " |")
    lines.append("")
    packed, dequantized = logits.get("Q4_K_M packed"), logits.get("Q4_K_M dequantized to bf16")
    if packed is not None and dequantized is not None:
        lines.append(f"Kernels alone: Q4_K_M packed vs the same file dequantized to bf16, logit RMS "
                     f"{rms(packed, dequantized):.4f}, max {(packed - dequantized).abs().max():.3f}.")
    lines.append("Targets (issue 20, Q4_K_M): B=1 >= 450, B=8 >= 1,800, B=64 >= 8,400 tok/s.")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/gguf_quant"))
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gguf_quant",
                    help="where the model files go (~14 GB for the 8B shape; not under --out)")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--few-rows-only", action="store_true",
                    help="only the few-row sweep (old tile kernel vs FEW_ROWS_CONFIGS vs bf16, 1-16 rows)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try the engine part at --shape qwen3-tiny")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--packed", default="1", help=argparse.SUPPRESS)
    ap.add_argument("--logits", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dummy", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quantize", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)), help="decode batch sizes timed")
    ap.add_argument("--calibrate-only", action="store_true",
                    help="only start each run's engine: its products timed into the calibration cache (which "
                         "$ONEBIT_CALIBRATION_CACHE names), so that later runs restore them (gpu_file_ab.sh's PRIME)")
    ap.add_argument("--runs", default=",".join(k for k in RUN_NAMES if k != "fp8"),
                    help=f"engine runs, of {', '.join(RUN_NAMES)}")
    args = ap.parse_args()
    unknown = set(args.runs.split(",")) - set(RUN_NAMES)
    if unknown:
        ap.error(f"--runs: unknown {', '.join(sorted(unknown))} (of {', '.join(RUN_NAMES)})")
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        child(args.child, args.packed, args.logits, args.dummy, args.device, batches, args.quantize,
              args.calibrate_only)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.few_rows_only:
        text = "\n".join(few_rows_table(args.out))
        (args.out / "few_rows.md").write_text(text + "\n")
        print(text)
        print(f"total {time.perf_counter() - started:.0f} s")
        return 0
    kernels = [] if args.skip_kernels or args.device != "cuda" else kernel_table()
    print(f"kernels done at {time.perf_counter() - started:.0f} s", flush=True)
    engine = engine_table(args.out, args.work, args.shape, args.device, batches, tuple(args.runs.split(",")),
                          args.calibrate_only)
    text = "\n".join(kernels + [""] + engine)
    (args.out / "gguf_quant.md").write_text(text + "\n")
    print(text)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
