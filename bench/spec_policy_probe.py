"""What the draft policy measures on this machine: its step-time estimates, the host preparation
time it charges drafting, the acceptance, and the tokens/s it gets, for one request at a time and
for batches, with the oracle drafter in the engine (no server).

    PYTHONPATH=. python3 bench/spec_policy_probe.py -m DIR --load-format dummy --device cuda \
        [--deterministic] [--p 0.75] [--batches 1,8] [--requests 4] [--max-tokens 128]

For each batch size it first records greedy outputs (the oracle's record), then runs the same
prompts with `--draft oracle:P` under the measured policy and under `always` (draft k_max every
step), and prints per run: tok/s, tokens drafted, and the policy's tables. Plain-step preparation
times are shown split into cold steps (nothing in flight: what the policy charges drafting) and
warm ones (launched while a step was in flight), so a launch that waits on the GPU shows up.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from onebit import LLM, SamplingParams
from onebit.bench.offline import random_prompts
from onebit.bench.oracle import OracleDrafter, oracle_speculation


def probe(args, batch: int, prompts: list[list[int]], record: Path, policy: str) -> str:
    """A warm-up round, then `args.requests` rounds of `batch` of `prompts`; a line of results plus
    the policy's tables."""
    llm = LLM(args.model, device=args.device, parallel=max(batch, 8), ctx_size=1024, load_format=args.load_format,
              deterministic=args.deterministic, overlap=True,
              speculative=oracle_speculation(args.p, record, policy=policy))
    pol = llm.engine.speculator.policy
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:batch], params)  # warm-up round
    start, proposed = time.perf_counter(), llm.engine.spec_proposed
    tokens = 0
    for r in range(args.requests):
        outs = llm.generate(prompts[r * batch:(r + 1) * batch], params)
        tokens += sum(len(o.token_ids) for o in outs)
    seconds = time.perf_counter() - start
    times = {f"k={k},b={b}": round(v * 1e3, 2) for (k, b), v in sorted(pol.times.items())}
    return (f"B={batch} policy={policy}: {tokens / seconds:,.0f} tok/s, drafted {llm.engine.spec_proposed - proposed}, "
            f"acceptance {pol.acceptance:.2f}\n  step ms {times}")


def main() -> None:
    """Parse, record, probe, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--p", type=float, default=0.75)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--requests", type=int, default=4, help="rounds of B prompts timed per run")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (int(b) for b in args.batches.split(",")):
            plain = LLM(args.model, device=args.device, parallel=max(batch, 8), ctx_size=1024,
                        load_format=args.load_format, deterministic=args.deterministic)
            prompts = random_prompts(batch * (args.requests + 1), 128, plain.engine.model_config.vocab_size, seed=batch)
            outs = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True))
            del plain
            record = Path(tmp) / f"record-{batch}.jsonl"
            OracleDrafter.write_record(record, [(p, o.token_ids) for p, o in zip(prompts, outs)])
            for policy in ("auto", "always"):
                lines.append(probe(args, batch, prompts, record, policy))
                print(lines[-1], flush=True)
    print("\n".join(["", "summary"] + lines))


if __name__ == "__main__":
    main()
