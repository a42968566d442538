"""Launch-table sweep of the batch-invariant product (`--deterministic`, issue 23), one device call.

    PYTHONPATH=. python3 bench/gpu_invariant_sweep.py --out $OUT [--budget 190]

(torch + triton only, no wheels; about 3.5 minutes on an H200.)
For each Qwen3-8B product shape and M = 1..256: times (CUDA graphs, `timing.graph_us`) a grid of
launches (BLOCK_N, warps, stages, BLOCK_M, BLOCK_K, variant) of `triton_invariant_matmul` in
several classes: no split (the reference launch is today's
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

At M >= 128 the grid holds Hopper-sized tiles (BLOCK_M 128/256, BLOCK_N 128/256, 8 warps, 3-5
stages) in every kernel variant: pointer loads, TMA loads, persistent, warp-specialized (see
`triton_invariant_matmul`); a launch that does not compile or is not bit-identical is dropped.
Last, the share of attention in a decode step at B = 64 and 256: the deterministic kernel
(`triton_invariant_attention`) against the default one (`triton_decode`), 36 layers, contexts
of 128-256 tokens in a 1024-token engine (bench/gpu_deterministic.py's decode runs), set against
the step time of issue 23's default tok/s; with the products, the predicted engine cost.
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
# Decode tok/s measured on the H200 by bench/gpu_deterministic.sh (issue 23): the default engine's
# gives the step time a difference is set against; the deterministic engine's with the built-in
# launches (the "now" column) and with the first sweep's table, whose products-only step (ms)
# this sweep's best is compared with.
DEFAULT_TOK_S = {1: 205, 8: 1573, 64: 10903, 256: 23167}
DET_TOK_S_BUILTIN = {1: 158, 8: 1258, 64: 9230, 256: 16970}
DET_TOK_S_TABLE = {1: 206, 8: 1603, 64: 10480, 256: 19744}
TABLE_PRODUCTS_MS = {1: 3.97, 8: 4.01, 64: 4.42, 128: 5.52, 256: 8.24}


# Hopper-sized tiles for M >= 128, (block_n, warps, stages, block_m, block_k); shared memory per
# stage is (BLOCK_M + BLOCK_N) x BLOCK_K x 2 bytes, so 3-4 stages fit the 227 KB of an H100/H200 SM.
LARGE = [(128, 8, 3, 128, 64), (128, 8, 4, 128, 64), (256, 8, 3, 128, 64), (256, 8, 4, 128, 64),
         (128, 4, 3, 128, 64), (128, 4, 4, 128, 64), (64, 4, 4, 128, 64), (64, 8, 4, 128, 64),
         (128, 8, 3, 128, 128), (128, 4, 3, 128, 128),
         (128, 4, 3, 64, 64), (128, 4, 4, 64, 64), (128, 4, 5, 64, 64), (256, 4, 3, 64, 64), (256, 8, 3, 64, 64),
         (64, 4, 4, 64, 64), (128, 4, 3, 64, 128),
         (64, 8, 3, 256, 64), (128, 8, 3, 256, 64)]


def candidates(m: int, splits: int) -> list[tuple[int, int, int, int, int, int]]:
    """(block_n, warps, stages, block_m, block_k, variant) launches tried at M rows in a class of `splits`."""
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
    out = [(*c, 0) for c in out]
    if m > 64:  # every variant at Hopper sizes (the split classes: no warp specialization)
        variants = (0, 1, 2, 3, 4) if splits == 1 else (0, 1, 2)
        out += [(*c, v) for v in variants for c in LARGE]
    elif m > 16:  # TMA and persistent TMA at the mid sizes
        out += [(bn, 4, st, 64, bk, v) for v in (1, 2) for bn in (32, 64, 128) for bk in (64, 128) for st in (4, 5)
                if splits == 1 or bk == 64]
    return list(dict.fromkeys(out))


def _compile(jobs: list[tuple]) -> tuple[list[tuple], list[str]]:
    """Worker: compile each (launch, split) of the product kernel and each reduce kernel into
    Triton's disk cache. Pointer launches (variant 0) only compile (pointer arguments are dtypes);
    TMA launches also run once on a small product, with the integer arguments of the sweep's
    shapes (all multiples of 16) so that the sweep reuses the binary: a variant that faults or
    hangs on this device then takes down a worker, not the sweep. Returns the jobs done."""
    from onebit.kernels import triton_invariant_matmul as tm
    done, errors = [], []
    bf16, f32 = torch.bfloat16, torch.float32
    for job in jobs:
        try:
            if job[0] == "sum":
                tm._sum_splits_kernel.warmup(f32, bf16, bf16, 16 * 4096, 4096, SPLITS=job[1], HAS_BIAS=False,
                                             BLOCK=1024, grid=(1,))
            elif job[1][5] == 0:
                (bn, warps, stages, bm, bk, _), split = job[1], job[2]
                n, k = 4096, 4096
                chunk = tm.chunk_len(k, 2) if split else k
                tm._matmul_kernel.warmup(bf16, bf16, bf16, f32 if split else bf16, 64, n, k, chunk, k, k, n,
                                         16 * n if split else 0, HAS_BIAS=False, SPLIT=split, BLOCK_M=bm,
                                         BLOCK_N=bn, BLOCK_K=bk, EVEN_K=True, DOT_FP32=False, num_warps=warps,
                                         num_stages=stages, grid=(1,))
            else:
                x = torch.randn(130, 1024, device=DEVICE).bfloat16()
                w = torch.randn(512, 1024, device=DEVICE).bfloat16()
                tm.matmul(x, w, None, job[1], 2 if job[2] else 1)
                torch.cuda.synchronize()
            done.append(job)
        except Exception as error:  # a launch this device cannot compile is simply not a candidate
            errors.append(f"{job}: {type(error).__name__}: {str(error)[:160]}")
    return done, errors


def precompile(workers: int, timeout: float) -> tuple[str, set]:
    """Compile every launch in `workers` processes; (a log line, the (launch, split) TMA launches
    that ran). Pointer launches first, then TMA ones, warp-specialized last in each worker."""
    jobs = {("mm", c, s > 1) for s in (1, 2) for m in MS for c in candidates(m, s)}
    from onebit.kernels import triton_invariant_matmul as tm
    jobs |= {("mm", tuple(tm.default_launch(m, n)), False) for m in MS for n, _ in SHAPES.values()}
    jobs |= {("mm", tuple(tm.Launch(32, 4, 4)), True)}  # the split classes' reference
    jobs = [("sum", s) for s in (2, 3, 4)] + sorted(jobs, key=lambda job: (job[1][5], str(job)))
    start = time.time()
    chunks = [jobs[i::workers] for i in range(workers)]
    pool = mp.get_context("spawn").Pool(workers)
    pending = [pool.apply_async(_compile, (chunk,)) for chunk in chunks]
    done, errors = [], []
    for i, result in enumerate(pending):
        try:
            d, e = result.get(timeout=max(1.0, start + timeout - time.time()))
            done += d
            errors += e
        except Exception as error:  # a hung or dead worker: its jobs are not candidates
            errors.append(f"worker {i}: {type(error).__name__} (its {len(chunks[i])} jobs dropped)")
    pool.terminate()
    for e in errors[:8]:
        print("  compile error:", e)
    tma_ok = {(job[1], job[2]) for job in done if job[0] == "mm" and job[1][5] != 0}
    tma_all = sum(1 for job in jobs if job[0] == "mm" and job[1][5] != 0)
    line = (f"precompiled {len(done)}/{len(jobs)} kernels in {time.time() - start:.0f} s ({workers} processes); "
            f"TMA launches that ran: {len(tma_ok)}/{tma_all}")
    return line, tma_ok


def sweep_shape(name, n, k, deadline, log, tma_ok):
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
        every = {c for m in MS for c in candidates(m, splits)} | {tuple(ref)}
        if splits == 1:
            every |= {tuple(tm.default_launch(m, n)) for m in MS}
        every = sorted(every)
        for c in every:
            if time.time() > deadline and c != tuple(ref):  # out of time: not checked, so not a candidate
                cls["failed"].append([list(c), "not checked: budget"])
                continue
            if c[5] != 0 and (c, splits > 1) not in tma_ok:
                cls["failed"].append([list(c), "did not run in a worker"])
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
            # the reference is timed past the deadline too, so that every class has a launch at every M
            for c in [tuple(ref)] + [c for c in candidates(m, splits) if c != tuple(ref)]:
                if c in identical and (time.time() < deadline or c == tuple(ref)):
                    row[",".join(map(str, c))] = graph_us(lambda: tm.matmul(xs[m], w, None, c, splits), replays)
            cls["times"][m] = row
        res["classes"][splits] = cls
        log(f"  {name} splits={splits}: {len(cls['identical'])} identical, {len(cls['different'])} different "
            f"({sorted({(c[3], c[4], c[5]) for c in cls['different']})} as (BLOCK_M, BLOCK_K, variant)), "
            f"{len(cls['failed'])} failed {sorted({f[1] for f in cls['failed']})}; "
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


def attention_share(log) -> dict[int, float]:
    """Decode attention of one step (36 layers, Qwen3-8B heads 32:8 x 128, contexts of 128-256
    tokens in a 1024-token engine with its split count), default kernel against the deterministic
    one, at B = 64 and 256; logs a table and returns {B: (deterministic - default) ms per step}."""
    from onebit.kernels import batch_invariant, triton_decode
    from onebit.kernels.attention import AttentionMetadata, paged_attention
    from onebit.kernels.timing import graph_us
    heads, kv_heads, dim, block, ctx_size = 32, 8, 128, 16, 1024
    splits = triton_decode.pick_num_splits(ctx_size)
    scale = dim ** -0.5
    log(f"Decode attention per step (36 layers; {heads}:{kv_heads} heads x {dim}, contexts 128-256 of {ctx_size}, "
        f"{splits} KV splits), against the default step time (issue 23's tok/s)")
    log("| B | default us/layer | deterministic us/layer | default ms/step (% of step) | deterministic ms/step "
        "(% of step) | deterministic - default, % of step |")
    log("|---:|---:|---:|---:|---:|---:|")
    extra = {}
    for b in (64, 256):
        gen = torch.Generator(device=DEVICE).manual_seed(b)
        blocks_per_seq = ctx_size // block
        num_blocks = b * blocks_per_seq
        k_cache = torch.randn(num_blocks, block, kv_heads, dim, device=DEVICE, generator=gen).bfloat16()
        v_cache = torch.randn(num_blocks, block, kv_heads, dim, device=DEVICE, generator=gen).bfloat16()
        tables = torch.randperm(num_blocks, device=DEVICE, generator=gen).to(torch.int32).view(b, blocks_per_seq)
        lens = torch.randint(128, 257, (b,), device=DEVICE, generator=gen).to(torch.int32)
        q = torch.randn(b, heads, dim, device=DEVICE, generator=gen).bfloat16()
        meta = AttentionMetadata(slot_mapping=None, num_decodes=b, decode_block_tables=tables,
                                 decode_context_lens=lens, prefills=[], decode_num_splits=splits,
                                 decode_max_context=ctx_size)

        def deterministic():
            with batch_invariant.mode(True):
                return paged_attention(q, k_cache, v_cache, meta, scale)
        default_us = graph_us(lambda: paged_attention(q, k_cache, v_cache, meta, scale))
        det_us = graph_us(deterministic)
        step = b / DEFAULT_TOK_S[b] * 1e3
        d_ms, t_ms = default_us * LAYERS / 1e3, det_us * LAYERS / 1e3
        extra[b] = t_ms - d_ms
        log(f"| {b} | {default_us:.1f} | {det_us:.1f} | {d_ms:.2f} ({d_ms / step:.1%}) | {t_ms:.2f} ({t_ms / step:.1%}) "
            f"| {(t_ms - d_ms) / step:+.1%} |")
        del k_cache, v_cache
        torch.cuda.empty_cache()
    return extra


def main():
    """Sweep the invariant product's launches per shape and M; write table.json and the summary under --out."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--budget", type=float, default=190, help="seconds after which no more launches are timed")
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
    line, tma_ok = precompile(args.workers, timeout=args.budget / 2)
    log(line)
    deadline = start + args.budget
    results, table = {}, {"device": device, "shapes": {}}
    for name, (n, k) in SHAPES.items():
        t0 = time.time()
        results[name] = sweep_shape(name, n, k, deadline, log, tma_ok)
        log(f"  {name} swept in {time.time() - t0:.0f} s")
    (out / "sweep.json").write_text(json.dumps(results, indent=1, default=str))

    log("")
    log("| shape | M | cuBLAS us (TB/s) | now us | best us (TB/s) | best/cuBLAS | splits | launch (BN,warps,stages,BM,BK,variant) |")
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
    log("Decode step, products only (36 x qkv+o+gate_up+down + lm_head), ms: cuBLAS / built-in launches (now) /")
    log("first sweep's table / this sweep's best; predicted engine cost = (det products - cuBLAS products) /")
    log("default step time (issue 23's tok/s), measured engine cost in brackets")
    log("| M | cuBLAS | now | first table | best | best/cuBLAS | predicted cost now (measured) | "
        "first table (measured) | predicted cost best |")
    log("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in MS:
        cu, now, best = (totals[key][m] / 1e3 for key in ("cublas", "now", "best"))
        first = f"{TABLE_PRODUCTS_MS[m]:.2f}" if m in TABLE_PRODUCTS_MS else ""
        if m in DEFAULT_TOK_S:
            step = m / DEFAULT_TOK_S[m] * 1e3
            builtin, table_cost = (1 - det[m] / DEFAULT_TOK_S[m] for det in (DET_TOK_S_BUILTIN, DET_TOK_S_TABLE))
            tail = (f"{(now - cu) / step:.0%} ({builtin:.0%}) | {(TABLE_PRODUCTS_MS[m] - cu) / step:.0%} "
                    f"({table_cost:.1%}) | {(best - cu) / step:.1%} |")
        else:
            tail = "| | |"
        log(f"| {m} | {cu:.2f} | {now:.2f} | {first} | {best:.2f} | {best / cu:.2f} | {tail}")
    if not complete:
        log("(incomplete: some shape has no table entry; the totals leave it out)")
    log("")
    extra = attention_share(log)
    log("")
    for b, ms in extra.items():
        cu, best = totals["cublas"][b] / 1e3, totals["best"][b] / 1e3
        step = b / DEFAULT_TOK_S[b] * 1e3
        log(f"predicted engine cost at B={b}, products (this table) + attention: "
            f"{(best - cu) / step:+.1%} {ms / step:+.1%} = {(best - cu + ms) / step:+.1%}")
    log("")
    log(f"table check through the loader: {'all identical' if verify_table(out / 'table.json', log) else 'NOT IDENTICAL'}")
    log(f"total {time.time() - start:.0f} s; table in table.json (ONEBIT_INVARIANT_TABLE=table.json to try it)")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
