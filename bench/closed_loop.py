"""The server's engine workload without the server: a closed loop of C requests driven straight
into LLMEngine (a finished request is replaced by a new one before the next step), with the
host time of each phase of a step measured separately.

    PYTHONPATH=. python3 bench/closed_loop.py [-m DIR | --shape qwen3-8b] [--concurrency 64]
        [--requests 256] [--prompt-tokens 128] [--max-tokens 128] [--device cuda]

Prints total tokens/s (prefill included, as `1bit bench` counts them) and, per step, the mean
milliseconds spent scheduling, running the forward (host side: preparing inputs and launching),
sampling (which waits for the GPU) and accepting tokens (detokenizing, stop checks, deltas).
Comparing its tokens/s with `1bit bench --serve` at the same concurrency separates the engine
from the HTTP front.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from onebit import LLM, SamplingParams


def timed(stats: dict, name: str, fn):
    """Wrap fn so that its wall time adds up in stats[name]."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            stats[name] += time.perf_counter() - start
    return wrapper


def main() -> None:
    """Run the closed loop and print the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--shape", default=None, help="a bench/make_shape_model.py shape with random weights")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--stagger", action="store_true",
                    help="output lengths uniform in [max/2, 3*max/2], so requests finish at different steps "
                         "and new prompts keep joining running decodes (the server's steady state)")
    ap.add_argument("--graph-chunk", type=int, default=None,
                    help="longest chunk per sequence that runs as graph rows (default: the engine's)")
    ap.add_argument("--overlap", action="store_true", help="queue each step before the last one's tokens arrive")
    args = ap.parse_args()
    options = {"overlap": args.overlap}
    model = args.model
    if args.shape:
        from make_shape_model import make_shape_model  # noqa: E402  (bench/ is the script directory)
        model = str(make_shape_model(Path(tempfile.mkdtemp()) / args.shape, args.shape))
        options.update(load_format="dummy", ctx_size=args.prompt_tokens + args.max_tokens + 16,
                       max_batch_tokens=8192)
        options["ctx_size"] += args.max_tokens // 2
    if model is None:
        from onebit.models.default_model import default_model_dir
        model = str(default_model_dir())
    llm = LLM(model, device=args.device, parallel=args.concurrency, **options)
    engine = llm.engine
    if args.graph_chunk is not None:
        engine.runner.max_graph_chunk = args.graph_chunk
    stats: dict[str, float] = defaultdict(float)
    for name in ("drafts", "schedule", "forward (host)", "sample (queued)",
                 "update (waits for tokens; append inside)", "  of which append"):
        stats[name] = 0.0  # the table's order
    engine.speculator.propose = timed(stats, "drafts", engine.speculator.propose)
    engine.scheduler.schedule = timed(stats, "schedule", engine.scheduler.schedule)
    engine.runner.run = timed(stats, "forward (host)", engine.runner.run)
    engine._sample = timed(stats, "sample (queued)", engine._sample)
    # Waiting for a step's tokens (the GPU) and accepting them; with overlap the next step runs meanwhile.
    engine._update = timed(stats, "update (waits for tokens; append inside)", engine._update)
    engine._append = timed(stats, "  of which append", engine._append)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    def add(i: int) -> None:
        p = params
        if args.stagger:
            p = SamplingParams(temperature=0, ignore_eos=True,
                               max_tokens=rng.randint(args.max_tokens // 2, args.max_tokens * 3 // 2))
        engine.add_request(f"r{i}", [rng.randrange(32, 250) for _ in range(args.prompt_tokens)], p)

    sent = 0
    for _ in range(min(args.concurrency, args.requests)):
        add(sent)
        sent += 1
    tokens = steps = 0
    start = time.perf_counter()
    while engine.has_unfinished():
        for delta in engine.step():
            tokens += len(delta.token_ids)
            if delta.finished and sent < args.requests:
                add(sent)
                sent += 1
        steps += 1
    wall = time.perf_counter() - start
    print(f"overlap {'on' if engine.overlap else 'off'}; graph chunk {engine.runner.max_graph_chunk}; closed loop, C={args.concurrency}, {args.requests} requests of {args.prompt_tokens}+{args.max_tokens} "
          f"tokens: {tokens / wall:,.0f} generated tok/s, {steps} steps, {wall / steps * 1e3:.2f} ms/step")
    print(engine.step_summary())
    from onebit.kernels import gemv
    print(f"bf16 picks (gemv.picks, cuBLAS elsewhere): {gemv.picks()}")
    print("| phase | ms per step |\n|---|---:|")
    for name, seconds in stats.items():
        print(f"| {name} | {seconds / steps * 1e3:.2f} |")
    nested = stats.get("  of which append", 0.0)
    print(f"| other | {(wall - sum(stats.values()) + nested) / steps * 1e3:.2f} |")


if __name__ == "__main__":
    main()
