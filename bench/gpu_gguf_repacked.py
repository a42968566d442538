"""Repacked GGUF weights on the GPU: the few-row kernel's config sweep against bf16 cuBLAS (#20).

    PYTHONPATH=. python3 bench/gpu_gguf_repacked.py --out DIR                 # kernels (~2-3 min)
    PYTHONPATH=. python3 bench/gpu_gguf_repacked.py --out DIR --engine        # then engine decode B=1/8

Kernels: Q4_K, Q6_K, Q8_0 weights (random bf16 encoded by onebit.testing.gguf_encode, then repacked,
`gguf_repack.RepackedMatrix`) at the Qwen3-8B products (qkv 6144x4096, o 4096x4096, gate_up 24576x4096,
down 4096x12288) and the head (151936x4096), 1/2/4/8/16 activation rows (--rows: others, "int" and "dot" up to 64): every
`triton_gguf_repacked.CONFIGS` entry (each mode up to its MODE_MAX_ROWS) and bf16 cuBLAS on the dequantized
weight, each timed inside a CUDA graph (`onebit.kernels.timing.graph_us`; modes "f16"/"f16s" on rows
prepared beforehand at the products whose producer prepares them, PREPARED_PRODUCTS); TB/s counts the
bytes each reads (repacked bytes; bf16: 2 per weight). Each config's result is checked against the float32
product with the dequantized weight, and the Triton dequantizer against the torch reference bit for
bit. The kernels of the sweep are compiled first in parallel worker processes (Triton's disk cache),
so the timing loop compiles nothing.

Then per config the geometric mean of its speed-up over bf16 per row count, and the best config per
(type, row count): DIR/gguf_repacked_table.json, the file `triton_gguf_repacked` takes its defaults
from (copy it to onebit/kernels/gguf_repacked_table.json, or point $ONEBIT_GGUF_REPACKED_TABLE at
it). Tables in DIR/gguf_repacked.md, printed last.

--engine (a few more minutes, ~14 GB disk under --work): bench/gpu_gguf_quant.py's engine run at
B = --batches (default 1,8) with this run's table: bf16 weights, Q4_K_M packed (repacked), Q4_K_M
dequantized, Q8_0 packed; decode tok/s and logit errors.

On the device (carry .whl, see tools/device_wheels.sh: the device lacks gguf and the server's packages):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
        .whl/*.whl && PYTHONPATH=/tmp/site:. TQDM_DISABLE=1 python3 bench/gpu_gguf_repacked.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

PRODUCTS = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
            "down_proj": (4096, 12288), "lm_head": (151936, 4096)}
# The products whose producer hands them `F16Rows` in the engine (the input norms before qkv and
# gate_up: `onebit.models.gguf.packed.fuse_f16_inputs`): modes "f16"/"f16s" are timed there on rows
# prepared outside the timing, as the engine runs them (before session 21 every product paid its own
# `prepare_x` launch here, 4-5 us, which held "int" ahead at some of them); o_proj, down_proj and the
# head prepare x themselves.
PREPARED_PRODUCTS = ("qkv_proj", "gate_up_proj")
# --rows, --types, --configs and --wide set $ONEBIT_SWEEP_ROWS, _TYPES, _CONFIGS and _WIDE so that
# the compile workers sweep the same counts, types and configs.
TYPES = tuple(os.environ.get("ONEBIT_SWEEP_TYPES", "Q4_K,Q6_K,Q8_0").split(","))
ROWS = tuple(int(m) for m in os.environ.get("ONEBIT_SWEEP_ROWS", "1,2,4,8,16").split(","))


# A config whose product is off the float32 one by more than this anywhere (the launches that pass
# are at 1e-3 and below: x's rounding) is reported but never picked.
MAX_PICK_ERROR = 1e-2
# A product shape takes its own pick where the fastest config there beats the type's pick by this.
SHAPE_MIN_GAIN = 1.05


def wide_configs() -> dict:
    """--wide: a grid around the measured winners instead of `CONFIGS` (~100 configs): "fma" (1-4
    rows) over BLOCK_N, NG, stages and programs; "int" over (BLOCK_N, warps), NG, stages and
    programs (fewer programs: less split-K partial traffic at many rows)."""
    from onebit.kernels.triton_gguf_repacked import RepackedConfig

    out = {}
    for bn in (16, 32, 64):
        for ng in (1, 2, 4):
            for stages in (2, 3):
                for programs in (256, 512, 1024):
                    out[f"fma-n{bn}-g{ng}-s{stages}-p{programs}"] = RepackedConfig("fma", bn, ng, stages=stages,
                                                                                    programs=programs)
    for bn, warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
        for ng in (1, 2):
            for stages in (2, 3):
                for programs in (128, 256, 512):
                    out[f"int-n{bn}-w{warps}-g{ng}-s{stages}-p{programs}"] = RepackedConfig(
                        "int", bn, ng, warps=warps, stages=stages, programs=programs)
    return out


def sweep_configs() -> dict:
    """The configs this sweep times: `triton_gguf_repacked.CONFIGS`, or with --wide `wide_configs`; with
    --configs only those named."""
    from onebit.kernels import triton_gguf_repacked as tr

    configs = wide_configs() if os.environ.get("ONEBIT_SWEEP_WIDE") == "1" else tr.CONFIGS
    chosen = os.environ.get("ONEBIT_SWEEP_CONFIGS")
    if not chosen:
        return configs
    unknown = [label for label in chosen.split(",") if label not in configs]
    if unknown:
        raise SystemExit(f"--configs: no such config {', '.join(unknown)} (names: {', '.join(configs)})")
    return {label: configs[label] for label in chosen.split(",")}


def runs_config(config, rows: int, qtype: str) -> bool:
    """Whether the sweep times `config` at `rows` (up to its mode's MODE_MAX_ROWS) for `qtype`."""
    from onebit.kernels import triton_gguf_repacked as tr

    return rows <= tr.MODE_MAX_ROWS[config.mode] and tr.takes(config, qtype)


def empty_repacked(qtype: str, n: int, k: int, device: str):
    """A RepackedMatrix of the right shapes and dtypes with uninitialised storage (for compiling)."""
    from onebit.kernels.gguf_repack import RepackedMatrix
    from onebit.kernels.gguf_quants import PackedMatrix

    tiny = RepackedMatrix.from_packed(PackedMatrix.from_blocks(
        torch.zeros(1, PackedMatrix.empty(qtype, 1, k).nbytes, dtype=torch.uint8), qtype, k))
    return RepackedMatrix(qtype, n, k, *(torch.empty(n, t.shape[1], dtype=t.dtype, device=device)
                                         for t in tiny.tensors.values()))


def compile_job(job: tuple[str, str]) -> tuple[str, str, float, str]:
    """In a worker process: launch config `job[1]` on every product and row count of type `job[0]` on
    empty weights, so that Triton compiles (and caches on disk) what the timing loop will launch."""
    from onebit.kernels import triton_gguf_repacked as tr

    qtype, label = job
    configs = sweep_configs()
    config = configs[label]
    start = time.perf_counter()
    try:
        for n, k in PRODUCTS.values():
            w = empty_repacked(qtype, n, k, "cuda")
            for m in ROWS:
                if runs_config(config, m, qtype):
                    tr.matmul_few_rows(torch.zeros(m, k, device="cuda", dtype=torch.bfloat16), w, config=config)
            if label == next(iter(configs)):
                tr.dequantize(w, torch.float32)
            del w
        torch.cuda.synchronize()
        return qtype, label, time.perf_counter() - start, ""
    except Exception as err:  # reported in the table; the timing loop then skips the config
        return qtype, label, time.perf_counter() - start, f"{type(err).__name__}: {str(err)[:300]}"


def precompile(workers: int) -> dict[tuple[str, str], str]:
    """Compile the sweep's kernels in `workers` processes; (qtype, config) -> error ('' when fine)."""
    jobs = [(qtype, label) for qtype in TYPES for label in sweep_configs()]
    start = time.perf_counter()
    import multiprocessing

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(compile_job, jobs))
    errors = {}
    for qtype, label, seconds, error in results:
        errors[qtype, label] = error
        if error:
            print(f"compile {qtype} {label}: {error}", flush=True)
    print(f"compiled {len(jobs)} jobs in {time.perf_counter() - start:.0f} s ({workers} workers)", flush=True)
    return errors


def random_repacked(qtype: str, n: int, k: int, device: torch.device):
    """A RepackedMatrix of random weights (random bf16 encoded by the torch GGUF encoders), on device."""
    from onebit.kernels.gguf_quants import PackedMatrix
    from onebit.kernels.gguf_repack import RepackedMatrix
    from onebit.testing.gguf_encode import ENCODERS

    w = torch.randn(n, k, device=device) * k ** -0.5
    return RepackedMatrix.from_packed(PackedMatrix.from_blocks(ENCODERS[qtype](w), qtype, k))


def geomean(values: list[float]) -> float:
    """Geometric mean (nan for no values)."""
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def speedup_vs_bf16(records: list[dict], label: str) -> float:
    """A config's speed-up over bf16 cuBLAS across sweep records (`gguf_repacked.json`'s): the
    geometric mean of bf16 us / its us over the records that timed it (nan for none)."""
    return geomean([r["bf16_us"] / r["us"][label] for r in records if label in r["us"]])


def sweep(out: Path, errors: dict, device: str = "cuda", timer=None) -> tuple[list[str], dict]:
    """Time every config and bf16 at every product, type and row count; markdown lines and the table.
    (device and timer only for a CPU smoke run in Triton's interpreter, at small PRODUCTS.)"""
    import torch.nn.functional as F

    from onebit.kernels import triton_gguf_repacked as tr
    from onebit.kernels.gguf_repack import F16Rows
    from onebit.kernels.timing import graph_us
    from onebit.kernels.triton_gguf_f16 import prepare_x

    dev = torch.device(device)
    graph_us = timer or graph_us
    configs = sweep_configs()
    records, exact = [], {}
    lines = ["| product | type | rows | best us (TB/s) | best config | bf16 cuBLAS us (TB/s) | best vs bf16 | "
             "fma-n16-g2 us | dot-n32-g2 us | int-n64-g1 us | worst rel err (config) |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for name, (n, k) in PRODUCTS.items():
        for qtype in TYPES:
            w = random_repacked(qtype, n, k, dev)
            dense = w.dequantize(torch.float32)
            exact[f"{name} {qtype}"] = bool(torch.equal(tr.dequantize(w, torch.float32), dense))
            dense16 = dense.to(torch.bfloat16)
            tb = w.nbytes / 1e6  # bytes / us / 1e6 = TB/s
            for m in ROWS:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                want = x.float() @ dense.t()
                prepared = x
                if name in PREPARED_PRODUCTS and m <= tr.MAX_INT_ROWS:
                    prepared = F16Rows(x, *prepare_x(x))
                rec = {"product": name, "n": n, "k": k, "qtype": qtype, "rows": m, "bytes": w.nbytes,
                       "bf16_us": graph_us(lambda: F.linear(x, dense16)), "us": {}, "rel_err": {}}
                for label, config in configs.items():
                    if not runs_config(config, m, qtype) or errors.get((qtype, label)):
                        continue
                    xin = prepared if config.mode in tr.F16_MODES else x
                    try:
                        got = tr.matmul_few_rows(xin, w, config=config).float()
                        rec["rel_err"][label] = ((got - want).norm() / want.norm()).item()
                        rec["us"][label] = graph_us(lambda: tr.matmul_few_rows(xin, w, config=config))
                    except Exception as err:  # a launch failure is a result, not a crash
                        print(f"{name} {qtype} {m} {label}: {type(err).__name__}: {str(err)[:200]}", flush=True)
                records.append(rec)
                timed = rec["us"]
                best = min(timed, key=timed.get) if timed else None
                b_us = timed.get(best, float("nan"))
                worst = max(rec["rel_err"], key=rec["rel_err"].get) if rec["rel_err"] else None
                lines.append(
                    f"| {name} {n}x{k} | {qtype} | {m} | {b_us:.1f} ({tb / b_us:.2f}) | {best} | {rec['bf16_us']:.1f} "
                    f"({n * k * 2 / 1e6 / rec['bf16_us']:.2f}) | {rec['bf16_us'] / b_us:.2f}x | "
                    f"{timed.get('fma-n16-g2', float('nan')):.1f} | {timed.get('dot-n32-g2', float('nan')):.1f} | "
                    f"{timed.get('int-n64-g1', float('nan')):.1f} | "
                    + (f"{rec['rel_err'][worst]:.1e} ({worst}) |" if worst else "- |"))
                print(lines[-1], flush=True)
            del w, dense, dense16
            torch.cuda.empty_cache()
    (out / "gguf_repacked.json").write_text(json.dumps({"records": records, "dequantize_exact": exact}, indent=1))
    lines += ["", f"Triton dequantizer equal to the torch reference bit for bit: "
              f"{sum(exact.values())}/{len(exact)}" + ("" if all(exact.values()) else f" (not: {[k for k, v in exact.items() if not v]})"),
              "", "Per config: geometric mean over products and types of the speed-up vs bf16 cuBLAS", "",
              "| config | " + " | ".join(f"{m} rows" for m in ROWS) + " |", "|---|" + "---:|" * len(ROWS)]
    for label in configs:
        cells = [speedup_vs_bf16([r for r in records if r["rows"] == m], label) for m in ROWS]
        lines.append(f"| {label} | " + " | ".join("n/a" if math.isnan(c) else f"{c:.2f}x" for c in cells) + " |")
    # Best config per (type, rows): the geometric mean over the products of bf16 us / config us.
    table, picks = {}, []
    for qtype in TYPES:
        for m in ROWS:
            group = [r for r in records if r["rows"] == m and r["qtype"] == qtype]
            scores = {label: speedup_vs_bf16(group, label) for label in configs}
            wrong = {label for r in group for label, err in r["rel_err"].items() if not err < MAX_PICK_ERROR}
            scores = {label: v for label, v in scores.items() if not math.isnan(v) and label not in wrong}
            if scores:
                label = max(scores, key=scores.get)
                table.setdefault(qtype, {})[str(m)] = configs[label]._asdict()
                picks.append(f"{qtype} {m}: {label} ({scores[label]:.2f}x)")
    shapes, notes = shape_picks(records, configs, table)
    table.update(shapes)
    (out / "gguf_repacked_table.json").write_text(json.dumps(table, indent=1) + "\n")
    lines += ["", "Best config per type and row count (DIR/gguf_repacked_table.json): " + ", ".join(picks)]
    lines += ["", f"Product shapes with their own pick (at least {SHAPE_MIN_GAIN:.2f}x the type's pick there): "
              + (", ".join(notes) or "none")]
    return lines, table


def shape_picks(records: list[dict], configs: dict, table: dict) -> tuple[dict, list[str]]:
    """({"QTYPE NxK": {rows: config fields}}, a note per pick): at each product shape and row count,
    the fastest config there where it beats the type's pick in `table` there by SHAPE_MIN_GAIN, both
    timed in this run, within MAX_PICK_ERROR of the float32 product."""
    out, notes = {}, []
    for r in records:
        pick = table.get(r["qtype"], {}).get(str(r["rows"]))
        label = next((name for name, c in configs.items() if c._asdict() == pick), None)
        timed = {name: us for name, us in r["us"].items() if r["rel_err"].get(name, 1.0) < MAX_PICK_ERROR}
        if label not in timed:
            continue
        best = min(timed, key=timed.get)
        gain = timed[label] / timed[best]
        if gain >= SHAPE_MIN_GAIN:
            key = f"{r['qtype']} {r['n']}x{r['k']}"
            out.setdefault(key, {})[str(r["rows"])] = configs[best]._asdict()
            notes.append(f"{key} {r['rows']}: {best} ({gain:.2f}x over {label})")
    return out, notes


def main() -> int:
    """Sweep the repacked kernel's configs (and with --engine, decode tok/s); the table printed last."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/gguf_repacked"))
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="compile processes")
    ap.add_argument("--engine", action="store_true", help="then engine decode tok/s with this run's table")
    ap.add_argument("--batches", default="1,8", help="decode batch sizes for --engine")
    ap.add_argument("--work", type=Path, default=None, help="--engine's model files (default: $TMPDIR)")
    ap.add_argument("--wide", action="store_true", help="time a grid of ~100 configs (wide_configs), not CONFIGS")
    ap.add_argument("--configs", default=None, help="comma-separated config names: time only these")
    ap.add_argument("--types", default=None, help="comma-separated GGUF types (default Q4_K,Q6_K,Q8_0)")
    ap.add_argument("--rows", default=None, help="activation row counts (default 1,2,4,8,16; modes int and dot up to 64)")
    args = ap.parse_args()
    if args.wide:
        os.environ["ONEBIT_SWEEP_WIDE"] = "1"
    if args.configs:
        os.environ["ONEBIT_SWEEP_CONFIGS"] = args.configs
    if args.types:
        global TYPES
        os.environ["ONEBIT_SWEEP_TYPES"] = args.types
        TYPES = tuple(args.types.split(","))
    if args.rows:
        global ROWS
        os.environ["ONEBIT_SWEEP_ROWS"] = args.rows
        ROWS = tuple(int(m) for m in args.rows.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    errors = precompile(args.workers)
    lines, _ = sweep(args.out, errors)
    print(f"kernels done at {time.perf_counter() - started:.0f} s", flush=True)
    if args.engine:
        import tempfile

        from bench import gpu_gguf_quant

        os.environ["ONEBIT_GGUF_REPACKED_TABLE"] = str((args.out / "gguf_repacked_table.json").resolve())
        work = args.work or Path(tempfile.gettempdir()) / "gguf_quant"
        lines += [""] + gpu_gguf_quant.engine_table(args.out, work, "qwen3-8b", "cuda",
                                                    [int(b) for b in args.batches.split(",")])
    text = "\n".join(lines)
    (args.out / "gguf_repacked.md").write_text(text + "\n")
    print(text)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
