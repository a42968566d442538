"""Packed GGUF products past 64 rows: tiles (`triton_gguf_tiles`) against the weight dequantized for cuBLAS (#20).

    PYTHONPATH=. python3 bench/gpu_gguf_tiles.py --out DIR                  # ~2-3 min on an H200

For Q4_K and Q6_K weights (random bf16 encoded by onebit.testing.gguf_encode, repacked) at the
Qwen3-8B products (qkv 6144x4096, o 4096x4096, gate_up 24576x4096, down 4096x12288) and --rows
activation rows (default 128, 256, 512, 1024, 2048: prefill chunks), each timed inside a CUDA graph
(`onebit.kernels.timing.graph_us`, x prepared inside the timing as the o and down products pay it):
  - "dequant": what `triton_gguf_repacked.matmul` does past 64 rows today, the whole weight
    dequantized to bfloat16 and `F.linear`;
  - "bf16": `F.linear` on a bfloat16 weight held in memory (the floor, had the weights been stored so);
  - each TILE_CANDIDATES launch of `matmul_tiles` (one that fails to compile or run is reported).
Every launch is checked against the float32 product with the dequantized weight (relative error).
Then per row count the geometric mean over the products and types of dequant us / best-tile us for
each candidate, and the TILES_MAX_ROWS the run supports: the largest row count up to which one
candidate beats "dequant" at every measured count (its name and numbers printed; the constant, and
TILE_CONFIG / TILE_BLOCK_M, are set by hand from it). Results in DIR/gguf_tiles.json and .md,
the tables printed last.

--engine TILE_ROWS (a few more minutes, ~5 GB under --work): the 8B shape's random weights written as
Q4_K_M GGUF (`bench/gpu_gguf_quant.py`'s recipe), served packed in two fresh children, one with the
tiles off and one with ONEBIT_GGUF_TILE_ROWS=TILE_ROWS: prefill tok/s (one new token; the median of 3)
of 1 x 512, 4 x 512 and 1 x 2,048-token prompts (--max-batch-tokens 2048: a step holds up to 2,048
rows), and the RMS difference of the two runs' logits on a fixed 64-token prompt.

On the device (carry .whl, see tools/device_wheels.sh: the device lacks gguf):
    . bench/device_lib.sh && install_wheels && python3 bench/gpu_gguf_tiles.py --out $OUT [--engine 2048]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PRODUCTS = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
            "down_proj": (4096, 12288)}


CANDIDATES_ENV = "ONEBIT_TILE_CANDIDATES"  # --candidates: a comma-separated subset of tile_candidates()


def tile_candidates() -> dict:
    """name -> (RepackedConfig, block_m): the shipped TILE_CONFIG and its neighbours (only those named in
    $ONEBIT_TILE_CANDIDATES when set)."""
    from onebit.kernels import triton_gguf_tiles as tt
    from onebit.kernels.triton_gguf_repacked import RepackedConfig

    every = {"n128-m64": (tt.TILE_CONFIG, 64),
            "n64-m64": (RepackedConfig("f16s", 64, 1, programs=256), 64),
            "n128-m64-s3": (RepackedConfig("f16s", 128, 1, stages=3, programs=256), 64),
            "n128-m32": (RepackedConfig("f16s", 128, 1, programs=256), 32),
            "n256-m64-w8": (RepackedConfig("f16s", 256, 1, warps=8, programs=256), 64),
            "n128-m128-w8": (RepackedConfig("f16s", 128, 1, warps=8, programs=256), 128)}
    chosen = os.environ.get(CANDIDATES_ENV)
    if not chosen:
        return every
    unknown = [name for name in chosen.split(",") if name not in every]
    if unknown:
        raise SystemExit(f"--candidates: no such candidate {', '.join(unknown)} (names: {', '.join(every)})")
    return {name: every[name] for name in chosen.split(",")}


def geomean(values: list[float]) -> float:
    """Geometric mean (nan for no values)."""
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def measure(products: dict, types: list[str], rows: list[int], device: str = "cuda", timer=None) -> list[dict]:
    """One record per (product, type, rows): us of "dequant", "bf16" and each candidate, and each one's
    relative error against the float32 product. (device and timer other than the GPU's only for a
    CPU smoke run in Triton's interpreter, at small products.)"""
    import torch.nn.functional as F

    from bench.gpu_gguf_repacked import random_repacked
    from onebit.kernels import triton_gguf_repacked as tr
    from onebit.kernels import triton_gguf_tiles as tt
    from onebit.kernels.timing import graph_us

    timer = timer or graph_us
    dev = torch.device(device)
    records = []
    for name, (n, k) in products.items():
        for qtype in types:
            w = random_repacked(qtype, n, k, dev)
            dense = w.dequantize(torch.float32)
            dense16 = dense.to(torch.bfloat16)
            for m in rows:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                want = x.float() @ dense.t()
                runs = {"dequant": lambda: F.linear(x, tr.dequantize(w, torch.bfloat16)),
                        "bf16": lambda: F.linear(x, dense16)}
                for label, (config, block_m) in tile_candidates().items():
                    runs[label] = lambda config=config, block_m=block_m: tt.matmul_tiles(x, w, config=config,
                                                                                           block_m=block_m)
                rec = {"product": name, "n": n, "k": k, "qtype": qtype, "rows": m, "us": {}, "rel_err": {}}
                for label, run in runs.items():
                    try:
                        got = run().float()
                        rec["rel_err"][label] = ((got - want).norm() / want.norm()).item()
                        rec["us"][label] = timer(run)
                    except Exception as err:  # a launch this device cannot run is a result, not a crash
                        rec["us"][label] = None
                        rec["rel_err"][label] = f"{type(err).__name__}: {str(err)[:160]}"
                records.append(rec)
                print(json.dumps({key: rec[key] for key in ("product", "qtype", "rows", "us")}), flush=True)
            del w, dense, dense16
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return records


def speedups(records: list[dict], label: str, rows: int) -> float:
    """Geometric mean over the records at `rows` of dequant us / `label`'s us (nan where it did not run
    everywhere or passed 1e-2 relative error anywhere)."""
    group = [r for r in records if r["rows"] == rows]
    ok = [r for r in group if isinstance(r["us"].get(label), float) and isinstance(r["rel_err"].get(label), float)
          and r["rel_err"][label] < 1e-2]
    if not group or len(ok) < len(group):
        return float("nan")
    return geomean([r["us"]["dequant"] / r["us"][label] for r in ok])


def supported_max_rows(records: list[dict], rows: list[int]) -> tuple[int, str | None]:
    """(the largest row count up to which one candidate beats "dequant" at every measured count, that
    candidate), (0, None) when none beats it at the first."""
    best = (0, None)
    for label in tile_candidates():
        reach = 0
        for m in sorted(rows):
            if not speedups(records, label, m) > 1.0:
                break
            reach = m
        if reach > best[0]:
            best = (reach, label)
    return best


def report(records: list[dict], rows: list[int]) -> list[str]:
    """Markdown: us per product, type and rows; the speed-ups over "dequant"; the supported limit."""
    labels = ["dequant", "bf16"] + list(tile_candidates())
    lines = ["| product | type | rows | " + " | ".join(f"{label} us" for label in labels) + " | worst tile rel err |",
             "|---|---|---:|" + "---:|" * (len(labels) + 1)]
    for r in records:
        cells = [f"{r['us'][label]:.1f}" if isinstance(r["us"].get(label), float) else "fail" for label in labels]
        errs = [e for label, e in r["rel_err"].items() if label not in ("dequant", "bf16") and isinstance(e, float)]
        worst = f"{max(errs):.1e}" if errs else "-"
        lines.append(f"| {r['product']} {r['n']}x{r['k']} | {r['qtype']} | {r['rows']} | " + " | ".join(cells)
                     + f" | {worst} |")
    lines += ["", "Geometric mean over products and types of dequant us / candidate us (> 1: the tiles win)", "",
              "| candidate | " + " | ".join(f"{m} rows" for m in rows) + " |", "|---|" + "---:|" * len(rows)]
    for label in ["bf16"] + list(tile_candidates()):
        cells = [speedups(records, label, m) for m in rows]
        lines.append(f"| {label} | " + " | ".join("n/a" if math.isnan(c) else f"{c:.2f}x" for c in cells) + " |")
    reach, label = supported_max_rows(records, rows)
    lines += ["", f"TILES_MAX_ROWS this run supports: {reach}" + (f" (candidate {label})" if label else
                                                                     " (no candidate beat the dequantized weight)")]
    return lines


PREFILLS = ((1, 512), (4, 512), (1, 2048))  # (prompts, tokens each) of the engine's prefill timing


def prefill_child(model: str, logits_out: Path, device: str) -> None:
    """In a fresh process (its ONEBIT_GGUF_TILE_ROWS set by the parent): load the packed file, save the
    logits of a fixed prompt, print {"prefill_tok_s": {"PxT": tok/s}} (the median of 3 runs of one new
    token each, after a warm-up)."""
    from onebit import LLM, SamplingParams
    from tests.model_probe import all_logits

    llm = LLM(model, device=device, parallel=4, ctx_size=4096, dtype="bfloat16", gguf_keep_packed=True)
    torch.save(all_logits(llm, list(range(100, 164))).float().cpu(), logits_out)
    rng = random.Random(0)
    vocab = llm.engine.model_config.vocab_size
    speed = {}
    for count, tokens in PREFILLS:
        def run() -> float:
            prompts = [[rng.randrange(1000, vocab) for _ in range(tokens)] for _ in range(count)]
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0))
            return time.perf_counter() - start
        run()  # warm-up (compiles)
        speed[f"{count}x{tokens}"] = round(count * tokens / statistics.median(run() for _ in range(3)), 1)
    print(json.dumps({"prefill_tok_s": speed}))


def engine_prefill(out: Path, work: Path, tile_rows: int, shape: str = "qwen3-8b", device: str = "cuda") -> list[str]:
    """Write the Q4_K_M file, time the prefills with the tiles off and up to `tile_rows`; markdown lines."""
    from bench.gpu_gguf_quant import write_gguf_files
    from bench.make_shape_model import fill_vocab, make_shape_model

    model_dir = work / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    make_shape_model(model_dir, shape)
    fill_vocab(model_dir)
    gguf = write_gguf_files(model_dir, work, ["Q4_K_M"], device)["Q4_K_M"]
    results, logits = {}, {}
    for setting in (0, tile_rows):
        env = {**os.environ, "ONEBIT_GGUF_TILE_ROWS": str(setting), "TQDM_DISABLE": "1"}
        target = out / f"logits-tiles-{setting}.pt"
        done = subprocess.run([sys.executable, __file__, "--child", str(gguf), "--logits", str(target), "--device",
                               device], env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        if done.returncode:
            raise SystemExit(f"child (tiles up to {setting} rows) failed:\n{done.stderr[-4000:]}")
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])["prefill_tok_s"]
        logits[setting] = torch.load(target)
    keys = list(results[0])
    lines = ["", f"Engine prefill, Q4_K_M packed ({shape}), tok/s (median of 3, one new token each)", "",
             "| tiles | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for setting, speed in results.items():
        lines.append(f"| {'off' if setting == 0 else f'up to {setting} rows'} | "
                     + " | ".join(str(speed[key]) for key in keys) + " |")
    diff = (logits[0] - logits[tile_rows]).pow(2).mean().sqrt().item()
    lines.append(f"\nLogits on a 64-token prompt, tiles against off: RMS difference {diff:.4f} "
                 f"(logits std {logits[0].std().item():.2f}).")
    return lines


def main() -> int:
    """Measure, write DIR/gguf_tiles.json and .md, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/gguf_tiles"))
    ap.add_argument("--types", default="Q4_K,Q6_K")
    ap.add_argument("--rows", default="128,256,512,1024,2048")
    ap.add_argument("--engine", type=int, default=0, metavar="TILE_ROWS",
                    help="then the engine's prefill with the tiles off and up to TILE_ROWS rows")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gguf_tiles")
    ap.add_argument("--shape", default="qwen3-8b", help="--engine's model shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--skip-kernels", action="store_true", help="only --engine")
    ap.add_argument("--candidates", default=None, help="comma-separated candidate names: time only these")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--logits", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.candidates:
        os.environ[CANDIDATES_ENV] = args.candidates
        tile_candidates()  # an unknown name stops here
    if args.child:
        prefill_child(args.child, args.logits, args.device)
        return 0
    rows = [int(m) for m in args.rows.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    records = [] if args.skip_kernels else measure(PRODUCTS, args.types.split(","), rows, args.device)
    lines = report(records, rows) if records else []
    if args.engine:
        lines += engine_prefill(args.out, args.work, args.engine, args.shape, args.device)
    (args.out / "gguf_tiles.json").write_text(json.dumps(records, indent=1))
    (args.out / "gguf_tiles.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
