"""One device call for speculative decoding on the GPU: correctness first, then speed.

    PYTHONPATH=. python3 bench/gpu_spec.py [--out DIR] [--max-tokens 128]

1. A tiny model with an MTP head on CUDA: greedy output identical between CUDA graphs, eager
   steps, and MTP / n-gram drafting (verification steps replayed as graph rows); MTP drafting
   over an fp8 KV cache against plain steps over the same cache.
2. The Qwen3-8B shape (random bf16 weights): single-request decode speed with the oracle
   drafter (a measuring instrument: the target's own greedy token with probability P) at
   P = 0.5, 0.75, 0.9 against plain decoding, from a recorded plain run of the same prompts.
Prints one table last and writes it to DIR/spec.md.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import torch

from make_shape_model import make_shape_model  # noqa: E402  (bench/ is the script directory)

from onebit import LLM, SamplingParams
from onebit.bench.oracle import OracleDrafter, oracle_speculation


def check_tiny(work: Path) -> list[str]:
    """Greedy equality on CUDA: graphs vs eager vs drafting through graph rows."""
    from onebit.testing.tiny import make_tiny_model
    path = make_tiny_model(work / "tiny-mtp", arch="qwen3", layers=4, hidden=128, vocab=1024, mtp=True)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40, 50, 60], [7, 7, 7, 7, 7, 7, 7, 7, 7]]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outs = {}
    for name, options in (("graphs", {}), ("eager", {"cuda_graphs": False}),
                          ("mtp", {"speculative": "mtp"}), ("ngram", {"speculative": "ngram"})):
        llm = LLM(str(path), device="cuda", dtype="float32", parallel=3, **options)
        if llm.engine.speculator.policy is not None:
            policy = llm.engine.speculator.policy
            policy.choose = lambda batch, drafting=None, policy=policy: policy.k_max
        outs[name] = [o.token_ids for o in llm.generate(prompts, params)]
        if name in ("mtp", "ngram"):
            outs[name + " drafted"] = llm.engine.spec_proposed
        del llm
    # MTP over an fp8 (e4m3) KV cache against plain steps over the same cache (#20).
    for name, options in (("fp8-kv", {"kv_cache_dtype": "fp8"}),
                          ("fp8-kv mtp", {"kv_cache_dtype": "fp8", "speculative": {"method": "mtp", "policy": "always"}})):
        llm = LLM(str(path), device="cuda", dtype="float32", parallel=3, **options)
        outs[name] = [o.token_ids for o in llm.generate(prompts, params)]
        outs[name + " drafted"] = llm.engine.spec_proposed
        del llm
    return [f"tiny fp32 CUDA greedy, {name} == graphs: {outs[name] == outs['graphs']}"
            for name in ("eager", "mtp", "ngram")] + \
        [f"tiny fp32 CUDA greedy over an fp8 KV cache, mtp == plain: {outs['fp8-kv mtp'] == outs['fp8-kv']} "
         f"({outs['fp8-kv mtp drafted']} drafted)",
         f"tiny drafted tokens: mtp {outs['mtp drafted']}, ngram {outs['ngram drafted']}"]


def timed(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """Single-request tokens/s over the prompts one after another, and the outputs."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm-up
    torch.cuda.synchronize()
    start, outs = time.perf_counter(), []
    for p in prompts:
        outs += llm.generate([p], params)
    torch.cuda.synchronize()
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start), [o.token_ids for o in outs]


def oracle_table(work: Path, max_tokens: int, ps: list[float], deterministic: bool = False) -> list[str]:
    """Rows of speed against the oracle's P on the 8B shape, one request at a time."""
    model = make_shape_model(work / "qwen3-8b-shape")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1000, 100000, (128,), generator=gen).tolist() for _ in range(4)]
    common = dict(device="cuda", load_format="dummy", parallel=1, ctx_size=1024, deterministic=deterministic)
    plain = LLM(str(model), **common)
    base, ref = timed(plain, prompts, max_tokens)
    del plain
    gc.collect()
    torch.cuda.empty_cache()
    record = work / "record.jsonl"
    OracleDrafter.write_record(record, list(zip(prompts, ref)))
    rows = [f"| none | - | {base:,.1f} | 1.00x | - | - |"]
    for p in ps:
        for k_mode in ("policy", "k=3"):
            llm = LLM(str(model), speculative=oracle_speculation(p, record, draft_max=3), **common)
            if k_mode == "k=3":
                policy = llm.engine.speculator.policy
                policy.choose = lambda batch, drafting=None, policy=policy: policy.k_max
            rate, outs = timed(llm, prompts, max_tokens)
            e = llm.engine
            acc = e.spec_accepted / e.spec_proposed if e.spec_proposed else 0.0
            rows.append(f"| oracle P={p} | {k_mode} | {rate:,.1f} | {rate / base:.2f}x | "
                        f"{acc:.0%} of {e.spec_proposed} | {outs == ref} |")
            print(rows[-1], flush=True)
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    """Run the checks and the oracle table; print the table last."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("/tmp/out"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--p", default="0.5,0.75,0.9")
    ap.add_argument("--deterministic", action="store_true", help="batch-invariant kernels (--deterministic)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        checks = check_tiny(Path(tmp))
        for line in checks:
            print(line, flush=True)
        rows = oracle_table(Path(tmp), args.max_tokens, [float(p) for p in args.p.split(",")], args.deterministic)
    table = ["Qwen3-8B shape, bf16, random weights, 1 request at a time, 128-token prompts, "
             f"{args.max_tokens} new tokens, {torch.cuda.get_device_name()}"
             f"{', --deterministic' if args.deterministic else ''}",
             "", "| drafter | draft length | tok/s | speed-up | acceptance | same output |",
             "|---|---|---:|---:|---:|---|", *rows]
    (args.out / "spec.md").write_text("\n".join(checks + [""] + table) + "\n")
    print("\n".join(checks + [""] + table))


if __name__ == "__main__":
    main()
