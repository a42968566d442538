"""Record plain greedy outputs for the prompts `1bit bench` will send, for the oracle drafter.

`1bit bench --prompts random:N --concurrency C1,C2,...` draws level C's prompts from a pool seeded
with `seed + C` (onebit/bench/online.py, job.py). This script rebuilds the same pools, runs them
greedily through the engine (the same dummy weights the server draws) and writes the record that
`1bit serve --draft oracle:P --draft-record FILE` reads. Run from the repo root:

    python3 bench/oracle_record.py -m DIR --load-format dummy --device cuda \
        --prompts random:128 --concurrency 1,2,4,8 --max-tokens 128 --out record.jsonl
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from onebit import LLM, SamplingParams
from onebit.bench.online import requests_per_level
from onebit.bench.oracle import OracleDrafter
from onebit.bench.prompts import DEFAULT_RANDOM_IDS, make_prompts


def bench_prompts(spec: str, levels: list[int], seed: int, warmup: int,
                  requests: list[int] | None = None) -> list[list[int]]:
    """Every distinct token-id prompt the bench sends at these levels (warm-up included); `requests`:
    the bench's --requests (one count per level), None for its default."""
    defaults = SimpleNamespace(requests=requests, duration_s=None, concurrency=levels)  # the bench's settings
    pools = [make_prompts(spec, max(warmup, 1), "completions", seed="warm-up", id_range=DEFAULT_RANDOM_IDS)]
    for c in levels:
        pools.append(make_prompts(spec, requests_per_level(defaults, c), "completions", seed=seed + c,
                                  id_range=DEFAULT_RANDOM_IDS))
    seen, prompts = set(), []
    for pool in pools:
        for p in pool:
            if p.token_ids not in seen:
                seen.add(p.token_ids)
                prompts.append(list(p.token_ids))
    return prompts


def main() -> None:
    """Generate and write the record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompts", default="random:128")
    ap.add_argument("--concurrency", default="1,2,4,8,12,16,24,32,64")
    ap.add_argument("--requests", help="the bench's --requests: one count per --concurrency level, e.g. 8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0, help="the bench's --seed")
    ap.add_argument("--warmup", type=int, default=2, help="the bench's warm-up request count")
    ap.add_argument("--parallel", type=int, default=64)
    ap.add_argument("--ctx-size", type=int, default=1024)
    ap.add_argument("--deterministic", action="store_true", help="record with batch-invariant kernels")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    requests = [int(r) for r in args.requests.split(",")] if args.requests else None
    if requests is not None and len(requests) != len(levels):
        ap.error("--requests needs one count per --concurrency level")
    prompts = bench_prompts(args.prompts, levels, args.seed, args.warmup, requests)
    llm = LLM(args.model, device=args.device, parallel=args.parallel, ctx_size=args.ctx_size,
              load_format=args.load_format, deterministic=args.deterministic)
    start = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True))
    OracleDrafter.write_record(args.out, [(p, list(o.token_ids)) for p, o in zip(prompts, outs)])
    print(f"recorded {len(prompts)} prompts x {args.max_tokens} tokens in {time.perf_counter() - start:.1f} s "
          f"to {args.out}")


if __name__ == "__main__":
    main()
