"""Launch-table sweep of the batch-invariant product (`--deterministic`, issue 23), one device call.

    PYTHONPATH=. python3 bench/gpu_invariant_sweep.py --out $OUT [--budget 360]

For each Qwen3-8B product shape and M = 1..256: times (CUDA graphs, `timing.graph_us`) a grid of
launches of `triton_invariant_matmul` in several classes: no split (the reference launch is today's
`default_launch`) and, for the narrow shapes, a fixed split-K of 2, 3 or 4 (one class each). A
launch joins its class only if its rows are bit-identical to the class's reference launch at M = 1
and M = 256 on this device (BLOCK_M 16 / 128 and BLOCK_K 128 / 256 are in the grid: the check, not
an assumption, decides whether they change the tensor-core instruction chain). Per shape the
class with the smallest sum over M of (best / cuBLAS) wins; per M its fastest identical launch.
The winning table is then checked end to end through the loader: rows for M = 1..256 at the first
and last positions equal to the same rows at M = 256. Writes $OUT/table.json (for
`invariant_launch_table`), $OUT/sweep.json (every timing), $OUT/sweep.md (the table printed last),
with a decode-step estimate: 36 layers of the four layer products plus lm_head once.
Launches are compiled first in parallel worker processes (Triton's disk cache), then timed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
DEVICE = "cuda"  # a CPU dry run of the logic (interpreter, tiny shapes) sets "cpu"
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
LAYERS = 36
SPLIT_TRIES = {"qkv": [2, 4], "o": [2, 4], "down": [2, 3, 4]}  # the wide shapes have programs enough
# Decode tok/s of the default engine measured on the H200 (issue 23): the step time the product
# difference is set against in the estimate.
DEFAULT_TOK_S = {1: 206, 8: 1591, 64: 11073, 256: 23641}
DET_TOK_S = {1: 158, 8: 1258, 64: 9230, 256: 16970}


def candidates(m: int, splits: int) -> list[tuple[int, int, int, int, int]]:
    """(block_n, warps, stages, block_m, block_k) launches tried at M rows in a class of `splits`."""
    out = []
    if splits == 1:
        if m <= 16:
            for bm, bks, warps in ((64, (64, 128), (4, 8)), (16, (64, 128, 256), (4,))):
                out += [(bn, w, st, bm, bk) for bn in (16, 32, 64) for bk in bks for w in warps for st in (4, 6)]
        elif m <= 64:
            out += [(bn, w, st, 64, bk) for bn in (16, 32, 64, 128) for bk in (64, 128) for w in (4, 8) for st in (3, 4, 5)]
        else:
            out += [(bn, w, st, bm, bk) for bm in (64, 128) for bn in (64, 128, 256) for bk in (64, 128)
                    for w in (4, 8) for st in (3, 4)]
    elif m <= 16:
        out += [(bn, 4, st, 64, bk) for bn in (16, 32, 64) for bk in (64, 128) for st in (4, 6)]
    elif m <= 64:
        out += [(bn, 4, st, 64, 64) for bn in (32, 64, 128) for st in (3, 4)]
    else:
        out += [(bn, w, 3, 64, 64) for bn in (64, 128, 256) for w in (4, 8)]
    return out


def _compile(jobs: list[tuple]) -> tuple[int, list[str]]:
    """Worker: compile each (launch, split) of the product kernel and each reduce kernel into
    Triton's disk cache, without running them (pointer arguments are dtypes)."""
    from onebit.kernels import triton_invariant_matmul as tm
    done, errors = 0, []
    bf16, f32 = torch.bfloat16, torch.float32
    for job in jobs:
        try:
            if job[0] == "sum":
                tm._sum_splits_kernel.warmup(f32, bf16, bf16, 16 * 4096, 4096, SPLITS=job[1], HAS_BIAS=False,
                                             BLOCK=1024, grid=(1,))
            else:
                (bn, warps, stages, bm, bk), split = job[1], job[2]
                n, k = 4096, 4096
                chunk = tm.chunk_len(k, 2) if split else k
                tm._matmul_kernel.warmup(bf16, bf16, bf16, f32 if split else bf16, 64, n, k, chunk, k, k, n,
                                         16 * n if split else 0, HAS_BIAS=False, SPLIT=split, BLOCK_M=bm,
                                         BLOCK_N=bn, BLOCK_K=bk, DOT_FP32=False, num_warps=warps,
                                         num_stages=stages, grid=(1,))
            done += 1
        except Exception as error:  # a launch this device cannot compile is simply not a candidate
            errors.append(f"{job}: {type(error).__name__}: {str(error)[:120]}")
    return done, errors


def precompile(workers: int) -> str:
    jobs = {("mm", c, s > 1) for s in (1, 2) for m in MS for c in candidates(m, s)}
    from onebit.kernels import triton_invariant_matmul as tm
    jobs |= {("mm", tuple(tm.default_launch(m, n)), False) for m in MS for n, _ in SHAPES.values()}
    jobs = sorted(jobs, key=str) + [("sum", s) for s in (2, 3, 4)]
    start = time.time()
    chunks = [jobs[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_compile, chunks)
    errors = [e for _, errs in results for e in errs]
    for e in errors[:5]:
        print("  compile error:", e)
    return f"precompiled {sum(d for d, _ in results)}/{len(jobs)} kernels in {time.time() - start:.0f} s ({workers} processes)"


def sweep_shape(name, n, k, deadline, log):
    """Every timing and identity check of one shape: {"cublas": {m: us}, "now": {m: us},
    "classes": {splits: {"identical": [...], "different": [...], "times": {m: {launch: us}}}}}."""
    from onebit.kernels import triton_invariant_matmul as tm
    from onebit.kernels.timing import graph_us
    gen = torch.Generator(device=DEVICE).manual_seed(n + k)
    w = (torch.randn(n, k, device=DEVICE, generator=gen) * k ** -0.5).bfloat16()
    x = torch.randn(256, k, device=DEVICE, generator=gen).bfloat16()
    xs = {m: x[:m].contiguous() for m in MS}
    replays = 5 if n * k > 1e8 else 9
    res = {"cublas": {}, "now": {}, "classes": {}}
    for m in MS:
        res["cublas"][m] = graph_us(lambda: F.linear(xs[m], w), replays)
        res["now"][m] = graph_us(lambda: tm.matmul(xs[m], w, None, tm.default_launch(m, n), splits=1), replays)
    for splits in [1] + SPLIT_TRIES.get(name, []):
        ref = tm.default_launch(1, n) if splits == 1 else tm.Launch(32, 4, 4)
        ref256, ref1 = tm.matmul(x, w, None, ref, splits), tm.matmul(xs[1], w, None, ref, splits)
        cls = {"reference": list(ref), "reference_invariant": torch.equal(ref1, ref256[:1]),
               "identical": [], "different": [], "failed": [], "times": {}}
        every = sorted({c for m in MS for c in candidates(m, splits)})
        if splits == 1:
            every = sorted(set(every) | {tuple(tm.default_launch(m, n)) for m in MS})
        for c in every:
            if time.time() > deadline:  # out of time (a slow compile?): not checked, so not a candidate
                cls["failed"].append([list(c), "not checked: budget"])
                continue
            try:
                same = torch.equal(tm.matmul(x, w, None, c, splits), ref256) and \
                    torch.equal(tm.matmul(xs[1], w, None, c, splits), ref1)
            except Exception as error:
                cls["failed"].append([list(c), f"{type(error).__name__}"])
                continue
            cls["identical" if same else "different"].append(list(c))
        identical = {tuple(c) for c in cls["identical"]}
        for m in MS:
            row = {}
            for c in candidates(m, splits):
                if c in identical and time.time() < deadline:
                    row[",".join(map(str, c))] = graph_us(lambda: tm.matmul(xs[m], w, None, c, splits), replays)
            cls["times"][m] = row
        res["classes"][splits] = cls
        log(f"  {name} splits={splits}: {len(cls['identical'])} identical, {len(cls['different'])} different "
            f"({sorted({(c[3], c[4]) for c in cls['different']})} as (BLOCK_M, BLOCK_K)), {len(cls['failed'])} failed; "
            f"reference invariant M=1 vs 256: {cls['reference_invariant']}")
    del w, x, xs
    torch.cuda.empty_cache()
    return res


def choose(res):
    """(splits, {m: (launch, us)}) of the class with the smallest sum over M of best/cuBLAS among
    classes timed at every M; None when none is."""
    best = None
    for splits, cls in res["classes"].items():
        if not cls["reference_invariant"] or any(not cls["times"].get(m) for m in MS):
            continue
        picks = {m: min(cls["times"][m].items(), key=lambda kv: kv[1]) for m in MS}
        score = sum(us / res["cublas"][m] for m, (_, us) in picks.items())
        if best is None or score < best[0]:
            best = (score, splits, picks)
    return None if best is None else best[1:]


def verify_table(table_path, log) -> bool:
    """Load the table through `invariant_launch_table` and check, per shape, rows at M = 1..256 (first
    and last positions) against the same rows at M = 256, through the default `matmul` path."""
    from onebit.kernels import invariant_launch_table, triton_invariant_matmul as tm
    invariant_launch_table.load(str(table_path))
    ok_all = True
    for name, (n, k) in SHAPES.items():
        gen = torch.Generator(device=DEVICE).manual_seed(7)
        w = torch.randn(n, k, device=DEVICE, generator=gen).bfloat16()
        x = torch.randn(256, k, device=DEVICE, generator=gen).bfloat16()
        full = tm.matmul(x, w)
        ok = True
        for m in (1, 2, 3, 4, 5, 8, 12, 16, 24, 32, 48, 64, 65, 96, 128, 129, 200, 255):
            ok &= torch.equal(tm.matmul(x[:m], w), full[:m]) and torch.equal(tm.matmul(x[-m:], w), full[-m:])
        log(f"  table check {name}: splits {tm.split_count(n, k, x.device)}, rows identical M=1..256, any position: {ok}")
        ok_all &= ok
        del w, x, full
    return ok_all


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--budget", type=float, default=330, help="seconds after which no more launches are timed")
    ap.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    lines = []

    def log(line):
        print(line, flush=True)
        lines.append(line)
    device = torch.cuda.get_device_name()
    log(f"{device}, torch {torch.__version__}")
    log(precompile(args.workers))
    deadline = start + args.budget
    results, table = {}, {"device": device, "shapes": {}}
    for name, (n, k) in SHAPES.items():
        t0 = time.time()
        results[name] = sweep_shape(name, n, k, deadline, log)
        log(f"  {name} swept in {time.time() - t0:.0f} s")
    (out / "sweep.json").write_text(json.dumps(results, indent=1, default=str))

    log("")
    log("| shape | M | cuBLAS us (TB/s) | now us | best us (TB/s) | best/cuBLAS | splits | launch (BN,warps,stages,BM,BK) |")
    log("|---|---:|---:|---:|---:|---:|---:|---|")
    totals = {key: dict.fromkeys(MS, 0.0) for key in ("cublas", "now", "best")}
    complete = True
    for name, (n, k) in SHAPES.items():
        res = results[name]
        picked = choose(res)
        count = 1 if name == "lm_head" else LAYERS
        if picked is None:
            complete = False
            log(f"| {name} | - | no class timed at every M (budget?) | | | | | |")
            continue
        splits, picks = picked
        table["shapes"][f"{n},{k}"] = {"splits": splits, "launches": [[m, *map(int, picks[m][0].split(","))] for m in MS]}
        for m in MS:
            tb = lambda us: (n * k + m * k + m * n) * 2 / us / 1e6  # noqa: E731
            cu, now, (launch, us) = res["cublas"][m], res["now"][m], picks[m]
            totals["cublas"][m] += count * cu
            totals["now"][m] += count * now
            totals["best"][m] += count * us
            log(f"| {name} | {m} | {cu:.1f} ({tb(cu):.2f}) | {now:.1f} | {us:.1f} ({tb(us):.2f}) | {us / cu:.2f} | "
                f"{splits} | {launch} |")
    shapes = ",\n".join(f'  "{key}": {json.dumps(entry)}' for key, entry in table["shapes"].items())
    (out / "table.json").write_text(f'{{"device": {json.dumps(device)}, "shapes": {{\n{shapes}\n}}}}\n')
    log("")
    log("Decode step, products only (36 x qkv+o+gate_up+down + lm_head), ms: cuBLAS / now / best table;")
    log("predicted engine cost = (det products - cuBLAS products) / default step time (issue 23's tok/s)")
    log("| M | cuBLAS | now | best | now/cuBLAS | best/cuBLAS | predicted cost now (measured) | predicted cost best |")
    log("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in MS:
        cu, now, best = (totals[key][m] / 1e3 for key in ("cublas", "now", "best"))
        if m in DEFAULT_TOK_S:
            step = m / DEFAULT_TOK_S[m] * 1e3
            measured = 1 - DET_TOK_S[m] / DEFAULT_TOK_S[m]
            tail = f"{(now - cu) / step:.0%} ({measured:.0%}) | {(best - cu) / step:.0%} |"
        else:
            tail = "| |"
        log(f"| {m} | {cu:.2f} | {now:.2f} | {best:.2f} | {now / cu:.2f} | {best / cu:.2f} | {tail}")
    if not complete:
        log("(incomplete: some shape has no table entry; the totals leave it out)")
    log("")
    log(f"table check through the loader: {'all identical' if verify_table(out / 'table.json', log) else 'NOT IDENTICAL'}")
    log(f"total {time.time() - start:.0f} s; table in table.json (ONEBIT_INVARIANT_TABLE=table.json to try it)")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
