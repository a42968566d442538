"""One device call for `--deterministic` (issue 23): is greedy bf16 output the same bits whatever
the batch, and what does it cost? Qwen3-8B shape, random bf16 weights (load_format dummy).

    PYTHONPATH=. python3 bench/gpu_deterministic.py [--out DIR] [--max-tokens 64]

1. Kernels: rows of the batch-invariant product for M = 1..256 against the same rows computed
   in a batch of 256 (each 8B weight shape), and cuBLAS for contrast; attention of the same
   positions as a prefill chunk, a whole prefill and decode rows.
2. For the deterministic and the default engine: four 128-token prompts alone (the reference),
   in a batch of 64 at random positions, with overlapped steps, a 600-token prompt chunked by a
   256-token budget against whole, prefix-cache hits against cold, and oracle speculation at
   P = 0.5 / 0.75 / 0.9 with the draft policy and with k = 3 fixed: "identical" per row.
3. Decode tok/s at B = 1, 8, 64, 256 for both (128-token prompts, overlapped steps, graphs).
Prints one table last and writes it to DIR/deterministic.md. About 4-5 minutes on an H200.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from make_shape_model import make_shape_model  # noqa: E402  (bench/ is the script directory)

from onebit import LLM, SamplingParams
from onebit.bench.offline import run_batch
from onebit.bench.oracle import OracleDrafter, oracle_speculation

SHAPES_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
             "lm_head": (151936, 4096)}


def check_kernels() -> list[str]:
    """Bitwise row checks of the two batch-invariant kernels on the device."""
    from onebit.kernels import batch_invariant, triton_invariant_attention as ta, triton_invariant_matmul as tm
    from onebit.kernels.attention import AttentionMetadata
    gen = torch.Generator(device="cuda").manual_seed(0)
    lines = []
    for name, (n, k) in SHAPES_8B.items():
        w = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
        x = torch.randn(256, k, device="cuda", generator=gen).bfloat16()
        full, full_cublas = tm.matmul(x, w), F.linear(x, w)
        ours = cublas = True
        for m in (1, 2, 3, 4, 8, 12, 16, 24, 32, 64, 65, 96, 128, 129, 200):
            ours &= torch.equal(tm.matmul(x[:m], w), full[:m]) and torch.equal(tm.matmul(x[-m:], w), full[-m:])
            cublas &= torch.equal(F.linear(x[:m], w), full_cublas[:m])
        err = ((full.float() - full_cublas.float()).norm() / full_cublas.float().norm()).item()
        lines.append(f"matmul {name} {n}x{k}: rows identical for M=1..256, any position: {ours} "
                     f"(cuBLAS: {cublas}); rel diff to cuBLAS {err:.1e}")
        del w, x, full, full_cublas
    heads, kv, dim, bs = 32, 8, 128, 16
    context, chunk = 1000, 100
    kc = torch.randn(80, bs, kv, dim, device="cuda", generator=gen).bfloat16()
    vc = torch.randn(80, bs, kv, dim, device="cuda", generator=gen).bfloat16()
    table = torch.randperm(80, device="cuda", generator=gen)[:-(-context // bs)]
    q = torch.randn(context, heads, dim, device="cuda", generator=gen).bfloat16()
    common = dict(slot_mapping=None, decode_num_splits=4, decode_max_context=1024)

    def run(meta, rows):
        with batch_invariant.mode(True):
            return batch_invariant.attention(rows, kc, vc, meta, dim ** -0.5)
    pre = AttentionMetadata(num_decodes=0, decode_block_tables=None, decode_context_lens=None,
                            prefills=[(0, chunk, context)], prefill_block_tables=table[None], **common)
    whole = AttentionMetadata(num_decodes=0, decode_block_tables=None, decode_context_lens=None,
                              prefills=[(0, context, context)], prefill_block_tables=table[None], **common)
    lens = torch.arange(context - chunk + 1, context + 1, device="cuda", dtype=torch.int32)
    dec = AttentionMetadata(num_decodes=chunk, decode_block_tables=table[None].repeat(chunk, 1),
                            decode_context_lens=lens, prefills=[], **common)
    a, b, c = run(pre, q[-chunk:]), run(whole, q)[-chunk:], run(dec, q[-chunk:])
    lines.append(f"attention 32:8 heads, 4 splits: prefill chunk == whole prefill == decode rows: "
                 f"{torch.equal(a, b) and torch.equal(a, c)}")
    return lines


def gen_tokens(llm: LLM, prompts, max_tokens: int) -> list[list[int]]:
    """Greedy token ids per prompt."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params)]


def release() -> None:
    """Give the device memory of engines no longer referenced back before the next one loads."""
    gc.collect()
    torch.cuda.empty_cache()


def equality_rows(model: Path, work: Path, deterministic: bool, max_tokens: int, batches: list[int]):
    """(identity rows, timing rows) for one mode."""
    mode = "deterministic" if deterministic else "default"
    gen = torch.Generator().manual_seed(0)
    targets = [torch.randint(1000, 100000, (128,), generator=gen).tolist() for _ in range(4)]
    fillers = [torch.randint(1000, 100000, (128,), generator=gen).tolist() for _ in range(60)]
    long = torch.randint(1000, 100000, (600,), generator=gen).tolist()
    t0 = time.perf_counter()
    llm = LLM(str(model), device="cuda", dtype="bfloat16", load_format="dummy", parallel=256, ctx_size=1024,
              max_batch_tokens=8192, deterministic=deterministic)
    print(f"{mode} engine built in {time.perf_counter() - t0:.0f} s", flush=True)
    engine, blocks = llm.engine, llm.engine.scheduler.blocks
    blocks.enable_prefix_caching = False  # every comparison below but the prefix one runs cold
    rows = []

    def row(name, same):
        rows.append(f"| {name} | {mode} | {same} |")
        print(rows[-1], flush=True)

    engine.overlap = False
    alone = [gen_tokens(llm, [p], max_tokens)[0] for p in targets]
    long_whole = gen_tokens(llm, [long], max_tokens)[0]
    at = random.Random(1).sample(range(64), 4)
    batch = list(fillers)
    for i, p in sorted(zip(at, targets)):
        batch.insert(i, p)
    out = gen_tokens(llm, batch, max_tokens)
    row("batch of 64 at random positions == alone", [out[batch.index(p)] for p in targets] == alone)
    engine.overlap = True
    out = gen_tokens(llm, batch, max_tokens)
    row("batch of 64, overlapped steps == alone", [out[batch.index(p)] for p in targets] == alone)
    row("alone, overlapped steps == alone", [gen_tokens(llm, [p], max_tokens)[0] for p in targets] == alone)
    engine.overlap = False
    engine.scheduler.max_batch_tokens = 256  # 600 tokens: chunks of 256, 256, then 88 as graph rows
    row("600-token prompt in 3 chunks == whole", gen_tokens(llm, [long], max_tokens)[0] == long_whole)
    engine.scheduler.max_batch_tokens = 8192
    blocks.enable_prefix_caching = True
    gen_tokens(llm, [targets[0][:112] + targets[1][:16]], 8)  # caches 7 blocks of targets[0]
    hit = llm.generate([targets[0]], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
    row(f"prefix-cache hit ({hit.num_cached_tokens} cached tokens) == cold", hit.token_ids == alone[0])
    blocks.enable_prefix_caching = False
    timing = []
    engine.overlap = True
    run_batch(engine, 4, 128, 8, seed=999)
    for b in batches:
        r = run_batch(engine, b, 128, 128, seed=b)
        timing.append((b, r.decode_tokens_per_s))
        print(f"{mode} B={b}: decode {r.decode_tokens_per_s:,.0f} tok/s", flush=True)
    engine = blocks = llm = None
    release()

    record = work / f"record-{mode}.jsonl"
    OracleDrafter.write_record(record, list(zip(targets, alone)))
    llm = LLM(str(model), device="cuda", dtype="bfloat16", load_format="dummy", parallel=8, ctx_size=1024,
              enable_prefix_caching=False, deterministic=deterministic,
              speculative=oracle_speculation(0.5, record, draft_max=3))
    drafter, policy = llm.engine.speculator.drafter, llm.engine.speculator.policy
    for p in (0.5, 0.75, 0.9):
        drafter.p = p
        for fixed in (False, True):
            if fixed:
                policy.choose = lambda batch, drafting=None: policy.k_max
            else:
                policy.__dict__.pop("choose", None)
            before = llm.engine.spec_proposed
            out = gen_tokens(llm, targets, max_tokens)
            row(f"oracle P={p}, {'k=3' if fixed else 'policy'} ({llm.engine.spec_proposed - before} drafted), "
                "4 together == alone", out == alone)
    drafter = policy = llm = None
    release()
    return rows, timing


def main() -> int:
    """Kernel checks, identity rows and the cost table; the table printed last."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/out"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,8,64,256")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    start = time.perf_counter()
    lines = [f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}", *check_kernels()]
    print("\n".join(lines), flush=True)
    rows, timing = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_shape_model(Path(tmp) / "qwen3-8b-shape")
        for deterministic in (True, False):
            r, t = equality_rows(model, Path(tmp), deterministic, args.max_tokens, batches)
            rows += r
            timing[deterministic] = dict(t)
    table = lines + ["", f"Qwen3-8B shape, bf16, random weights, greedy, {args.max_tokens} new tokens",
                     "", "| comparison | kernels | identical |", "|---|---|---|", *rows,
                     "", "decode tok/s, 128-token prompts, 128 new tokens, CUDA graphs, overlapped steps",
                     "", "| batch | default | --deterministic | cost |", "|---:|---:|---:|---:|"]
    for b in batches:
        base, det = timing[False][b], timing[True][b]
        table.append(f"| {b} | {base:,.0f} | {det:,.0f} | {1 - det / base:+.1%} |")
    table.append(f"\ntotal {time.perf_counter() - start:.0f} s")
    (args.out / "deterministic.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
