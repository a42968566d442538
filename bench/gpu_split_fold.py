"""Session 13's two FP8/bf16 changes on the device, each against what runs by default (#19, #20).

    PYTHONPATH=. python3 bench/gpu_split_fold.py --out DIR [--batches 1,8,64,256] [--skip-engines]
    PYTHONPATH=. python3 bench/gpu_split_fold.py --out DIR --device cpu   # CPU try-out at toy size

1. Folded split-K (`triton_split_k.FOLD`): the tile's last program sums the partials instead of a
   reduce kernel. Per product of the Qwen3-8B shape (qkv, o, gate_up, down, head) and kernel
   (bf16 `triton_gemv.split_k_matmul` at 1 and 64 rows; FP8 weight-only `triton_fp8_fast.split_k`
   at 1 and 16 rows; FP8 w8a8 at 64 rows; repacked GGUF Q4_K at 1 row ("fma") and 64 ("int"), when
   the gguf package is there: carry .whl), a config with SPLIT > 1: the folded result against the
   reduce kernel's bit for bit, once eagerly and then at every one of 20 replays of one CUDA graph
   holding all the products in a row (they share the counters), and us per call of each way
   (`timing.graph_us`). A single differing bit is a failure: the fold's ordered sum must give the
   reduce kernel's bits.
2. The SiLU * mul + quantize kernel now in one block per row (`triton_fp8_fused`), at 1/16/64/256
   rows: us against `silu_mul` + the one-pass quantizer, and the norm + quantize pair the same way.
3. Engine decode tok/s (graphs, overlap, PDL; 128 + 128 tokens) at --batches for bf16 and fp8
   (FP8 head) engines: default, FOLD, and for fp8 FUSE_QUANT (the norms and SiLU * mul hand the
   w8a8 split-K its e4m3 rows) and both. Prediction (docs/perf.md): fp8 B=1 354 -> 380-400 with
   FOLD; fp8 B=64 14,862 -> 15,500-16,500 with both.
Tables printed last and written to DIR/split_fold.md. `--device cpu` runs part 1 eagerly at toy
shapes in Triton's interpreter (no graphs, no timings) and part 3 on the tiny shape, to try the
script before a device call.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import make_shape_model  # noqa: E402

from onebit.kernels import fp8, triton_fp8_fast, triton_fp8_fused, triton_fused, triton_gemv, triton_split_k  # noqa: E402
from onebit.kernels.timing import graph_us  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
# (label, rows, config): one split config per kernel and row count, among the calibration's candidates
PRODUCTS = [("bf16 split_k", 1, (16, 32, 128, 4, 4)), ("bf16 split_k", 64, (64, 64, 128, 2, 4)),
            ("fp8 split_k", 1, (1, 16, 512, 4, 4)), ("fp8 split_k", 16, (16, 32, 256, 4, 4)),
            ("fp8 split_k_w8a8", 64, (64, 64, 256, 2, 4)), ("gguf Q4_K", 1, "fma-n32-g2"),
            ("gguf Q4_K", 64, "int-n64-g1")]
TOY_SHAPES = {"qkv": (48, 256), "down": (32, 512)}
REPLAYS = 20
DEVICE = "cuda"


def product_call(label: str, rows: int, config: tuple, n: int, k: int):
    """A zero-argument function running one product of this kind, and its inputs kept alive."""
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter has no bf16 dot
    x = torch.randn(rows, k, device=DEVICE, dtype=dtype)
    if label.startswith("gguf"):
        from onebit.kernels import triton_gguf_repacked as tr
        from onebit.kernels.gguf_repack import RepackedMatrix
        from onebit.testing.gguf_encode import encode

        blocks = encode(torch.randn(n, k, device=DEVICE) * 0.02, "Q4_K")
        w = RepackedMatrix.from_blocks(torch.from_numpy(blocks), "Q4_K", k).to(DEVICE)
        return lambda: tr.matmul_few_rows(x, w, config=tr.CONFIGS[config])
    if label.startswith("bf16"):
        w = torch.randn(n, k, device=DEVICE, dtype=dtype) * 0.02
        return lambda: triton_gemv.split_k_matmul(x, w, None, config)
    q, scale = fp8.quantize_rows(torch.randn(n, k, device=DEVICE, dtype=dtype) * 0.02)
    if label.endswith("w8a8"):
        xq, xs = triton_fp8_fast.quantize_rows(x)
        return lambda: triton_fp8_fast.split_k(xq, q, scale, None, config, x_scale=xs.view(-1), out_dtype=x.dtype)
    return lambda: triton_fp8_fast.split_k(x, q, scale, None, config)


def has_gguf() -> bool:
    """Whether the gguf package (the GGUF rows' encoder) is installed."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


def fold_table() -> list[str]:
    """Part 1: bit-for-bit checks over graph replays and the time of each way."""
    lines = ["| kernel | rows | config | product | reduce us | folded us | folded / reduce | eager equal | "
             "replays equal |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    failures = 0
    cuda = DEVICE == "cuda"
    for label, rows, config in PRODUCTS:
        if label.startswith("gguf") and not has_gguf():
            lines.append(f"| {label} | {rows} | {config} | skipped: no gguf package (carry .whl) | | | | | |")
            continue
        calls = {name: product_call(label, rows, config, n, k)
                 for name, (n, k) in (SHAPES if cuda else TOY_SHAPES).items()}
        triton_split_k.FOLD = False
        want = {name: fn() for name, fn in calls.items()}
        reduce_us = {name: graph_us(fn) if cuda else float("nan") for name, fn in calls.items()}
        triton_split_k.FOLD = True
        eager = {name: fn().equal(want[name]) for name, fn in calls.items()}
        if not cuda:  # no graphs off the GPU: the eager check only
            triton_split_k.FOLD = False
            failures += sum(not ok for ok in eager.values())
            lines += [f"| {label} | {rows} | {config} | {name} | - | - | - | {eager[name]} | - |" for name in calls]
            continue
        folded_us = {name: graph_us(fn) for name, fn in calls.items()}
        # every product in one graph, in a row: consecutive folded launches share the counters
        torch.cuda.synchronize()
        graph, outs = torch.cuda.CUDAGraph(), {}
        with torch.cuda.graph(graph):
            for name, fn in calls.items():
                outs[name] = fn()
        equal = dict.fromkeys(calls, 0)
        for _ in range(REPLAYS):
            for out in outs.values():
                out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for name in calls:
                equal[name] += int(outs[name].equal(want[name]))
        counters_zero = int(triton_split_k._COUNTERS[torch.device("cuda", torch.cuda.current_device())]
                            .count_nonzero()) == 0
        triton_split_k.FOLD = False
        for name in calls:
            ok = eager[name] and equal[name] == REPLAYS
            failures += not ok
            lines.append(f"| {label} | {rows} | {config} | {name} | {reduce_us[name]:.1f} | {folded_us[name]:.1f} | "
                         f"{folded_us[name] / reduce_us[name]:.2f} | {eager[name]} | {equal[name]}/{REPLAYS} |")
        lines.append(f"| {label} | {rows} | counters back at zero after the replays: {counters_zero} | | | | | | |")
        failures += not counters_zero
        del graph, outs, calls, want
        torch.cuda.empty_cache()
    lines += ["", f"folded split-K: {'PASSED' if failures == 0 else f'FAILED ({failures} mismatches)'}"]
    return lines


def fused_table() -> list[str]:
    """Part 2: the fused producers against the unfused kernel + the one-pass quantizer."""
    lines = ["| producer | rows | unfused + quantizer us | fused us | fused speed-up |", "|---|---:|---:|---:|---:|"]
    for rows in (1, 16, 64, 256):
        gate_up = torch.randn(rows, 2 * 12288, device="cuda", dtype=torch.bfloat16)
        unfused = graph_us(lambda: triton_fp8_fast.quantize_rows(triton_fused.silu_mul(gate_up)))
        fused = graph_us(lambda: triton_fp8_fused.silu_mul_quantize(gate_up))
        lines.append(f"| SiLU * mul | {rows} | {unfused:.1f} | {fused:.1f} | {unfused / fused:.2f}x |")
        x, res = (torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
        unfused = graph_us(lambda: triton_fp8_fast.quantize_rows(triton_fused.add_rms_norm(x, res, w, 1e-6)[0]))
        fused = graph_us(lambda: triton_fp8_fused.add_rms_norm_quantize(x, res, w, 1e-6))
        lines.append(f"| add + RMSNorm | {rows} | {unfused:.1f} | {fused:.1f} | {unfused / fused:.2f}x |")
    return lines


ENGINES = {"bf16": (None, False, False), "bf16-fold": (None, True, False),
           "fp8": ("fp8", False, False), "fp8-fold": ("fp8", True, False),
           "fp8-fuse": ("fp8", False, True), "fp8-fold-fuse": ("fp8", True, True)}


def engine_table(batches: list[int], names: list[str]) -> list[str]:
    """Part 3: decode tok/s per engine setting and batch size."""
    from onebit.bench.offline import decode_speeds
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig

    shape = make_shape_model(Path(tempfile.mkdtemp()) / "shape", "qwen3-8b" if DEVICE == "cuda" else "qwen3-tiny")
    lines = ["| engine | " + " | ".join(f"B={b}" for b in batches) + " | build s |",
             "|---|" + "---:|" * (len(batches) + 1)]
    for name in names:
        quantize, fold, fuse = ENGINES[name]
        triton_split_k.FOLD, fp8.FUSE_QUANT = fold, fuse
        fp8.reset()
        try:
            start = time.perf_counter()
            engine = build_engine(EngineConfig(
                model=str(shape), device=DEVICE, dtype="bfloat16" if DEVICE == "cuda" else "float32", parallel=max(batches), ctx_size=128 + 128 + 16,
                max_batch_tokens=8192, enable_prefix_caching=False, load_format="dummy",
                cuda_graphs=DEVICE == "cuda", overlap=DEVICE == "cuda", quantize=quantize, quantize_lm_head=quantize is not None))
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            built = time.perf_counter() - start
            speeds = decode_speeds(engine, batches, 128, 128, name)
            lines.append(f"| {name} | " + " | ".join(f"{s:,.0f}" for s in speeds) + f" | {built:.0f} |")
            del engine
        except Exception:
            traceback.print_exc()
            lines.append(f"| {name} | FAILED (traceback above) |")
        gc.collect()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    triton_split_k.FOLD, fp8.FUSE_QUANT = False, False
    return lines


def main() -> int:
    """The three parts; tables printed last."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/split_fold"))
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda; cpu to try the script at toy size")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    lines = [f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU (toy shapes)'}  torch {torch.__version__}", ""]
    for part in (fold_table, fused_table) if DEVICE == "cuda" else (fold_table,):
        try:
            lines += part() + [""]
        except Exception:
            traceback.print_exc()
            lines += [f"{part.__name__} FAILED (traceback above)", ""]
        (args.out / "split_fold.md").write_text("\n".join(lines) + "\n")
    if not args.skip_engines:
        lines += engine_table([int(b) for b in args.batches.split(",")], args.engines.split(","))
    text = "\n".join(lines)
    (args.out / "split_fold.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
