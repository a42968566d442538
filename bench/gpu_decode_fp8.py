"""Decode attention with a bf16 and an e4m3 KV cache, per launch candidate (one device call, ~1-2 min).

    PYTHONPATH=. python3 bench/gpu_decode_fp8.py [--out DIR] [--launches t64-w4,t128-w8,...]

`--kv-cache-dtype fp8` halves the bytes a decode step's attention reads, but the engine measured
it slower than bf16 at B=256 (session 11: 23,512 against 24,415 tok/s). This times
`triton_decode.paged_decode_attention` alone, Qwen3-8B shape (32 query heads, 8 KV heads of 128),
16-token blocks in scattered order, at each (rows, context) below, for both cache dtypes and each
launch in `triton_decode.CANDIDATES`. Each point cycles through enough layers' caches (up to 36)
that one replay reads at least 400 MB, past the 50 MB L2; times are per layer, from CUDA graphs,
with the adaptive split rule (context bound = the context). Outputs are checked against the
default launch of the same dtype (relative L2) and the e4m3 one against bf16 for scale. Prints
one table last and writes it to DIR/decode_fp8.md.

With --prefill, then the flash prefill kernel (one layer, its default launch) over the bf16 cache
and the e4m3 cache with bfloat16 and float16 products (`triton_prefill.FP8_DOT_F16`, off until this
says): a 2k prompt, an 8k one, four 2k ones, a 512-token chunk at the end of 8k.

With --engine, then the engine (random bf16 weights, `load_format="dummy"`, CUDA graphs, 12 GiB
of KV): decode tok/s at B = 64 and 256 with 128 + 128 tokens and at B = 32 with 1,024 + 128, for
the bf16 cache and the e4m3 cache with bfloat16 products (before), float16 products, and float16
products on `--fp8-launch`, then `--quantize fp8` weights with each cache; each engine built after
setting the kernel's switches, so its graphs hold that launch (--quick: four of those rows).
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_attention_long import BLOCK, DIM, HEADS, KV_HEADS, rel  # noqa: E402  (bench/ is the script directory)

from onebit.kernels import kv_fp8, triton_decode, triton_prefill, triton_prefill_flash  # noqa: E402
from onebit.kernels.timing import graph_us  # noqa: E402

POINTS = [(1, 2048), (1, 8192), (8, 2048), (32, 2048), (64, 256), (64, 2048), (256, 192), (256, 1024)]
MIN_READ_BYTES = 400 * 2**20
# row name -> (the cache's `triton_decode.LAUNCH` key, FP8_DOT_F16): the bf16 cache; e4m3 with
# float16 products (the default); e4m3 with bfloat16 products (as before session 16)
DTYPES = {"bf16": ("bf16", True), "fp8": ("fp8", True), "fp8-bf16dot": ("fp8", False)}


class Layer:
    """One layer's paged caches (bf16 and e4m3 with per-head scales) for `rows` contexts of `ctx` tokens."""

    def __init__(self, rows: int, ctx: int, gen: torch.Generator):
        per_seq = -(-ctx // BLOCK)
        blocks = rows * per_seq
        self.k = torch.randn(blocks, BLOCK, KV_HEADS, DIM, device="cuda", generator=gen).bfloat16()
        self.v = torch.randn(blocks, BLOCK, KV_HEADS, DIM, device="cuda", generator=gen).bfloat16()
        self.tables = torch.randperm(blocks, device="cuda", generator=gen).int().reshape(rows, per_seq)
        self.k_scale = kv_fp8.scales_from_amax(self.k.abs().amax(dim=(0, 1, 3)))
        self.v_scale = kv_fp8.scales_from_amax(self.v.abs().amax(dim=(0, 1, 3)))
        self.k8 = kv_fp8.quantize(self.k, self.k_scale)
        self.v8 = kv_fp8.quantize(self.v, self.v_scale)


def point(rows: int, ctx: int, launches: dict, gen: torch.Generator) -> dict:
    """{(dtype, launch name): (us per layer, rel err)} at one (rows, ctx), plus the e4m3 vs bf16 error."""
    layer_bytes = rows * ctx * KV_HEADS * DIM * 2 * 2  # K and V, bf16
    count = max(1, min(36, math.ceil(MIN_READ_BYTES / layer_bytes)))
    layers = [Layer(rows, ctx, gen) for _ in range(count)]
    q = torch.randn(rows, HEADS, DIM, device="cuda", generator=gen).bfloat16()
    lens = torch.full((rows,), ctx, dtype=torch.int32, device="cuda")
    scale = DIM ** -0.5
    results = {}

    def call(layer: Layer, fp8: bool, launch):
        if fp8:
            return triton_decode.paged_decode_attention(q, layer.k8, layer.v8, layer.tables, lens, scale,
                                                        num_splits=None, max_context=ctx, k_scale=layer.k_scale,
                                                        v_scale=layer.v_scale, launch=launch)
        return triton_decode.paged_decode_attention(q, layer.k, layer.v, layer.tables, lens, scale,
                                                    num_splits=None, max_context=ctx, launch=launch)

    outs = {}
    for dtype, (cache, f16) in DTYPES.items():
        fp8 = cache == "fp8"
        triton_decode.FP8_DOT_F16 = f16
        base = call(layers[0], fp8, None)
        outs[dtype] = base
        for name, launch in launches.items():
            try:
                err = rel(call(layers[0], fp8, launch), base)
                us = graph_us(lambda: [call(layer, fp8, launch) for layer in layers]) / count
            except Exception as exc:  # a launch that does not compile (registers, shared memory) is a row, not a stop
                print(f"{rows}x{ctx} {dtype} {name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                us, err = float("nan"), float("nan")
            results[(dtype, name)] = (us, err)
            print(f"{rows}x{ctx} {dtype} {name}: {us:.1f} us, rel {err:.1e}", flush=True)
    triton_decode.FP8_DOT_F16 = True
    results["fp8 vs bf16"] = rel(outs["fp8"], outs["bf16"])
    del layers
    torch.cuda.empty_cache()
    return results


PREFILL_CASES = [("2k prompt", [2048], [2048]), ("8k prompt", [8192], [8192]),
                 ("4 x 2k prompts", [2048] * 4, [2048] * 4), ("512 chunk at 8k", [512], [8192])]


def prefill_rows(gen: torch.Generator) -> list[str]:
    """Flash prefill attention of one layer (its default launch), ms: the bf16 cache, the e4m3 cache
    with bfloat16 products and with float16 products (`triton_prefill.FP8_DOT_F16`); table lines."""
    lines = ["| prefill | bf16 cache ms | e4m3, bf16 products | e4m3, f16 products | f16 vs bf16 products | rel err f16 vs bf16 products |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, qlens, ctxs in PREFILL_CASES:
        blocks = [-(-c // BLOCK) for c in ctxs]
        layer = Layer(1, sum(blocks) * BLOCK, gen)  # one pool of blocks, cut into the sequences' tables
        tables = torch.zeros(len(ctxs), max(blocks), dtype=torch.int32, device="cuda")
        flat = layer.tables.flatten()
        for i, n in enumerate(blocks):
            tables[i, :n] = flat[sum(blocks[:i]):sum(blocks[:i]) + n]
        q = torch.randn(sum(qlens), HEADS, DIM, device="cuda", generator=gen).bfloat16()
        starts = [sum(qlens[:i]) for i in range(len(qlens))]
        plan = triton_prefill_flash.plan_tiles(starts, qlens, ctxs, HEADS, KV_HEADS, q.device,
                                               triton_prefill_flash.DEFAULT_LAUNCH)

        def run(fp8: bool, f16: bool):
            triton_prefill.FP8_DOT_F16 = f16
            k, v = (layer.k8, layer.v8) if fp8 else (layer.k, layer.v)
            scales = {"k_scale": layer.k_scale, "v_scale": layer.v_scale} if fp8 else {}
            out = triton_prefill_flash.paged_prefill_attention(q, k, v, starts, qlens, ctxs, tables, DIM ** -0.5,
                                                                plan=plan, **scales)
            us = graph_us(lambda: triton_prefill_flash.paged_prefill_attention(
                q, k, v, starts, qlens, ctxs, tables, DIM ** -0.5, plan=plan, **scales))
            return us / 1000, out

        bf16_ms, _ = run(False, False)
        before_ms, before = run(True, False)
        after_ms, after = run(True, True)
        triton_prefill.FP8_DOT_F16 = False
        lines.append(f"| {name} | {bf16_ms:.3f} | {before_ms:.3f} | {after_ms:.3f} | {before_ms / after_ms:.2f}x | "
                     f"{rel(after, before):.1e} |")
        print(lines[-1], flush=True)
        del layer
        torch.cuda.empty_cache()
    return lines


def engine_rows(fp8_launch: str, quick: bool = False) -> list[str]:
    """Decode tok/s of the engine per KV cache setting (see the module doc); table lines."""
    from make_shape_model import make_shape_model

    from onebit.bench.offline import run_batch
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig

    shape = make_shape_model(Path(tempfile.mkdtemp()) / "shape", "qwen3-8b")
    settings = [("bf16 cache", "auto", True, "t64-w4", None), ("e4m3, bf16 products", "fp8", False, "t64-w4", None),
                ("e4m3, f16 products", "fp8", True, "t64-w4", None),
                (f"e4m3, f16 products, {fp8_launch}", "fp8", True, fp8_launch, None),
                ("fp8 weights, bf16 cache", "auto", True, "t64-w4", "fp8"),
                (f"fp8 weights, e4m3 cache ({fp8_launch})", "fp8", True, fp8_launch, "fp8")]
    if quick:
        settings = [settings[0], settings[3], settings[4], settings[5]]
    points = [(64, 128), (256, 128), (32, 1024)]
    lines = ["| KV cache | " + " | ".join(f"B={b}, {p}+128" for b, p in points) + " | KV blocks |",
             "|---|" + "---:|" * (len(points) + 1)]
    for label, kv, f16, launch, quantize in settings:
        triton_decode.FP8_DOT_F16 = f16
        triton_decode.LAUNCH["fp8"] = triton_decode.CANDIDATES[launch]  # the bf16 cache's stays
        engine = build_engine(EngineConfig(
            model=str(shape), device="cuda", dtype="bfloat16", parallel=256, ctx_size=1024 + 128 + 16,
            max_batch_tokens=8192, enable_prefix_caching=False, kv_cache_memory=12 * 2**30,
            load_format="dummy", kv_cache_dtype=kv, quantize=quantize))
        run_batch(engine, 4, 128, 8, seed=999)  # warm-up
        speeds = []
        for batch, prompt in points:
            speeds.append(run_batch(engine, batch, prompt, 128, seed=batch).decode_tokens_per_s)
            print(f"{label} B={batch} {prompt}+128: {speeds[-1]:,.0f} tok/s", flush=True)
        lines.append(f"| {label} | " + " | ".join(f"{v:,.0f}" for v in speeds)
                     + f" | {engine.scheduler.blocks.num_blocks:,} |")
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    triton_decode.FP8_DOT_F16 = True
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/decode_fp8"))
    ap.add_argument("--launches", default=",".join(triton_decode.CANDIDATES))
    ap.add_argument("--engine", action="store_true", help="then the engine table (~3 min)")
    ap.add_argument("--fp8-launch", default=next(n for n, c in triton_decode.CANDIDATES.items() if c == triton_decode.LAUNCH["fp8"]), help="the e4m3 launch of the engine's last row")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--prefill", action="store_true", help="then the flash prefill kernel over each cache (~30 s)")
    ap.add_argument("--quick", action="store_true", help="engine rows: bf16 cache, e4m3 on --fp8-launch, and both with fp8 weights")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    launches = {name: triton_decode.CANDIDATES[name] for name in args.launches.split(",")}
    defaults = {dtype: next((n for n, c in launches.items() if c == triton_decode.LAUNCH[cache]), None)
                for dtype, (cache, _) in DTYPES.items()}
    if args.skip_kernels:
        text = "\n".join(engine_rows(args.fp8_launch, args.quick))
        (args.out / "decode_fp8_engine.md").write_text(text + "\n")
        print(text)
        return 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    table = {}
    for rows, ctx in POINTS:
        table[(rows, ctx)] = point(rows, ctx, launches, gen)
    names = list(launches)
    lines = ["| rows x context | dtype | " + " | ".join(names) + " | best (TB/s) | vs bf16 default |",
             "|---|---|" + "---:|" * (len(names) + 2)]
    gains = {(d, n): [] for d in DTYPES for n in names}
    for (rows, ctx), res in table.items():
        bf16_default = res.get(("bf16", defaults["bf16"]), (float("nan"), 0))[0]
        for dtype in DTYPES:
            times = {n: res[(dtype, n)][0] for n in names}
            best = min((n for n in names if not math.isnan(times[n])), key=times.get)
            read = rows * ctx * KV_HEADS * DIM * 2 * (2 if DTYPES[dtype][0] == "bf16" else 1)
            cells = [f"{times[n]:.1f}" for n in names]
            lines.append(f"| {rows} x {ctx} | {dtype} | " + " | ".join(cells)
                         + f" | {best} {times[best]:.1f} ({read / times[best] / 1e6:.2f}) | {bf16_default / times[best]:.2f}x |")
            default = times.get(defaults[dtype], float("nan"))
            for n in names:
                gains[(dtype, n)].append(default / times[n])
    lines += ["", "Geometric mean over the points of the speed-up vs the shipped launch of the same dtype "
              f"(bf16 {defaults['bf16']}, fp8 {defaults['fp8']}):", "",
              "| launch | " + " | ".join(DTYPES) + " |", "|---|" + "---:|" * len(DTYPES)]
    for n in names:
        cells = []
        for dtype in DTYPES:
            vals = [g for g in gains[(dtype, n)] if not math.isnan(g)]
            cells.append(f"{math.exp(sum(map(math.log, vals)) / len(vals)):.3f}x" if vals else "nan")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    worst = max(res[(d, n)][1] for res in table.values() for d in DTYPES for n in names
                if not math.isnan(res[(d, n)][1]))
    lines += ["", f"Worst relative error of a launch against the default of its dtype: {worst:.1e}; "
              "e4m3 against bf16 output: " + ", ".join(f"{r}x{c} {res['fp8 vs bf16']:.1e}"
                                                       for (r, c), res in table.items())]
    if args.prefill:
        lines += ["", "Flash prefill attention, one layer, default launch:", ""] + prefill_rows(gen)
    if args.engine:
        lines += ["", "Engine decode tok/s (12 GiB of KV):", ""] + engine_rows(args.fp8_launch, args.quick)
    text = "\n".join(lines)
    (args.out / "decode_fp8.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
