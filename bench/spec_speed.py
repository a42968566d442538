"""Single-request decode speed with and without speculative drafting (MTP head or n-gram).

    PYTHONPATH=. python3 bench/spec_speed.py [--device cpu|cuda] [--max-tokens 128] [--concurrency 1,4]

Runs the built-in demo model (or -m DIR) greedily on a few Python prompts, one request at a
time (and at higher concurrency if asked), and prints tokens/s, the speed-up and the
acceptance the engine observed. Output is identical with and without drafting (checked here too).
"""

from __future__ import annotations

import argparse
import time

from onebit import LLM, SamplingParams
from onebit.models.default_model import default_model_dir

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef list_files(path):",
           "def read_json(path):", "def parse_args(argv):", "class Matrix:\n    def __add__(self, other):"]


def run(llm: LLM, concurrency: int, max_tokens: int) -> tuple[float, list[list[int]]]:
    """Tokens/s over all prompts, `concurrency` at a time; and the outputs."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=8))  # warm-up
    start, outs = time.perf_counter(), []
    for i in range(0, len(PROMPTS), concurrency):
        outs += llm.generate(PROMPTS[i:i + concurrency], params)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start), [o.token_ids for o in outs]


def main() -> None:
    """Print one table row per (drafter, concurrency)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1")
    ap.add_argument("--drafters", default="mtp,ngram")
    args = ap.parse_args()
    model = args.model or str(default_model_dir())
    levels = [int(c) for c in args.concurrency.split(",")]
    print("| drafter | concurrency | tok/s | speed-up | acceptance | same output |")
    print("|---|---:|---:|---:|---:|---|")
    for c in levels:
        plain_llm = LLM(model, device=args.device, parallel=c)
        base, ref = run(plain_llm, c, args.max_tokens)
        print(f"| none | {c} | {base:,.1f} | 1.00x | - | - |", flush=True)
        del plain_llm
        for drafter in args.drafters.split(","):
            llm = LLM(model, device=args.device, parallel=c, speculative=drafter)
            rate, outs = run(llm, c, args.max_tokens)
            e = llm.engine
            acc = e.spec_accepted / e.spec_proposed if e.spec_proposed else 0.0
            print(f"| {drafter} | {c} | {rate:,.1f} | {rate / base:.2f}x | {acc:.0%} of {e.spec_proposed} | "
                  f"{outs == ref} |", flush=True)
            del llm


if __name__ == "__main__":
    main()
