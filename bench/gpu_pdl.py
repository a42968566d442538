"""Programmatic dependent launch (`onebit.kernels.pdl`) on the device: decode tok/s with it off and
on, and whether the greedy tokens stay the same (they must: same kernels, same order).

    PYTHONPATH=. python3 bench/gpu_pdl.py [--out DIR] [--engines bf16,fp8] [--batches 1,8,64]
        [--shape qwen3-8b] [--device cuda]

One device call (~4 min, no wheels). Qwen3-8B shape with random weights, CUDA graphs, overlapped
steps; per engine (bf16; fp8 = `--quantize fp8` with its FP8 head) it builds the engine with PDL
off, then again with PDL on keeping the first build's few-row kernel choices (the start-up
calibration is timing-based and could pick other kernels, which would change the rounding and
hide PDL's own effect). Each build: greedy tokens of four 128-token prompts (32 new), then decode
tok/s at each batch size (128 prompt + 128 new tokens, `onebit.bench.offline.run_batch`, best of
two runs). Prediction (G23, session 10): the gap between kernels, 0.43-0.54 ms a step, roughly
halves: +4-8% at B=1 for fp8, where every product is a Triton kernel, less for bf16, whose cuBLAS
products do not take part. Table printed last, and written to DIR/pdl.md.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import make_shape_model  # noqa: E402  (bench/ is the script directory)

from onebit import SamplingParams  # noqa: E402
from onebit.bench.offline import random_prompts, run_batch  # noqa: E402
from onebit.engine import runner as engine_runner  # noqa: E402
from onebit.engine.build import build_engine  # noqa: E402
from onebit.engine.config import EngineConfig  # noqa: E402
from onebit.kernels import pdl  # noqa: E402


def greedy_tokens(engine, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy continuations of `prompts`, run together."""
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True)
    out = {i: [] for i in range(len(prompts))}
    for i, p in enumerate(prompts):
        engine.add_request(f"greedy-{i}", p, params)
    while engine.has_unfinished():
        for d in engine.step():
            out[int(d.request_id.split("-")[1])] += d.token_ids
    return [out[i] for i in range(len(prompts))]


def measure(model: Path, label: str, batches: list[int], device: str) -> tuple[list[list[int]], dict[int, float]]:
    """(greedy tokens, {batch: decode tok/s}) of one build with the current `pdl.enabled`."""
    engine = build_engine(EngineConfig(
        model=str(model), device=device, dtype="bfloat16" if device == "cuda" else "float32",
        parallel=max(batches), ctx_size=320,
        max_batch_tokens=8192, enable_prefix_caching=False, load_format="dummy", overlap=True,
        quantize="fp8" if label == "fp8" else None))
    prompts = random_prompts(4, 128, engine.model_config.vocab_size, seed=5)
    tokens = greedy_tokens(engine, prompts, 32)
    speed = {}
    for b in batches:
        speed[b] = max(run_batch(engine, b, 128, 128, seed=100 + b + r).decode_tokens_per_s for r in range(2))
        print(f"{label} PDL {'on' if pdl.enabled else 'off'} B={b}: {speed[b]:,.0f} tok/s", flush=True)
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return tokens, speed


def main() -> None:
    """Parse, measure each engine with PDL off then on, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--engines", default="bf16,fp8")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--device", default="cuda", help="cpu: checks the script (no Triton kernel runs there)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.device == "cuda" and not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
                                      and pdl.supported()):
        print("PDL needs an sm_90+ GPU and a Triton with grid-dependency control; nothing measured")
        return
    model = make_shape_model(Path(tempfile.mkdtemp()) / "shape", args.shape)
    lines = ["| engine | B | PDL off tok/s | PDL on tok/s | change | greedy tokens the same |",
             "|---|---:|---:|---:|---:|---|"]
    calibrations = (engine_runner.gemv.calibrate, engine_runner.fp8.calibrate)
    for label in args.engines.split(","):
        pdl.enabled = False
        tokens_off, off = measure(model, label, batches, args.device)
        pdl.enabled = True
        # keep the PDL-off build's kernel choices (module-level tables), so only PDL differs
        engine_runner.gemv.calibrate = engine_runner.fp8.calibrate = lambda *a, **k: []
        try:
            tokens_on, on = measure(model, label, batches, args.device)
        except Exception as exc:  # e.g. a graph capture that refuses PDL launches: report it, go on
            print(f"{label} with PDL failed: {exc!r}", flush=True)
            lines += [f"| {label} | {b} | {off[b]:,.0f} | failed: {type(exc).__name__} | - | - |" for b in batches]
            continue
        finally:
            engine_runner.gemv.calibrate, engine_runner.fp8.calibrate = calibrations
            pdl.enabled = False
            gc.collect()
        same = sum(a == b for x, y in zip(tokens_off, tokens_on) for a, b in zip(x, y))
        total = sum(len(x) for x in tokens_off)
        for b in batches:
            lines.append(f"| {label} | {b} | {off[b]:,.0f} | {on[b]:,.0f} | {on[b] / off[b] - 1:+.1%} | "
                         f"{same}/{total} |")
    where = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    text = "\n".join([f"PDL, {where}, torch {torch.__version__}, {args.shape} shape, random weights, "
                      "decode tok/s (128 + 128 tokens, best of 2)", ""] + lines)
    print("\n" + text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "pdl.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
