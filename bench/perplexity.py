"""Held-out perplexity through the engine, with and without FP8 weights (and head) and an FP8 KV cache.

    python bench/perplexity.py [--model DIR] [--device cpu] [--max-tokens 16384]

The text: Python standard-library files whose label the demo model's training held out
(tools/demo_training/corpus.py: a file is held out when sha256("val:python-stdlib/PATH") falls
under 2% of the range), read from this interpreter's standard library. Non-overlapping windows of
`--window` tokens each run as one prefill through the engine's runner and paged KV cache (so an
FP8 cache is written, then read back by the attention), and every position after the first
scores the next token. Prints one row per configuration and the change against the first.

FP8 products run the plain-torch references on the CPU: the weight-only one by default; the
"w8a8" rows (`fp8.CPU_EMULATES_GPU`) quantize the activations per token for every product the GPU
sends to `_scaled_mm` (a 512-token prefill: all of them), as the GPU does.
"""

from __future__ import annotations

import argparse
import json
import math
import sysconfig
import time
from pathlib import Path

import torch

HELD_OUT = ["base64.py", "queue.py", "socket.py", "logging/config.py", "modulefinder.py"]
CONFIGS = {  # name -> LLM options
    "float32": {"dtype": "float32"},
    "bf16": {"dtype": "bfloat16"},
    "fp8 weights": {"dtype": "float32", "quantize": "fp8", "quantize_lm_head": False},
    "fp8 KV": {"dtype": "float32", "kv_cache_dtype": "fp8"},
    "fp8 weights + KV": {"dtype": "float32", "quantize": "fp8", "quantize_lm_head": False, "kv_cache_dtype": "fp8"},
    "fp8 weights + head": {"dtype": "float32", "quantize": "fp8", "quantize_lm_head": True},
    "fp8 w8a8": {"dtype": "float32", "quantize": "fp8", "quantize_lm_head": False, "emulate_gpu": True},
    "fp8 w8a8 + head": {"dtype": "float32", "quantize": "fp8", "quantize_lm_head": True, "emulate_gpu": True},
    "fp8 w8a8 + head + KV": {"dtype": "float32", "quantize": "fp8", "quantize_lm_head": True, "emulate_gpu": True,
                             "kv_cache_dtype": "fp8"},
}


def held_out_text() -> str:
    """The held-out standard-library files, joined (each as the training corpus read it)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return "\n".join((root / name).read_text(encoding="utf-8").replace("\r\n", "\n") for name in HELD_OUT)


@torch.inference_mode()
def window_nll(llm, ids: list[int]) -> tuple[float, int]:
    """(summed negative log-likelihood of ids[1:] given their prefixes, count), one prefill."""
    from onebit import SamplingParams
    from onebit.engine.sequence import Sequence

    engine = llm.engine
    seq = Sequence("perplexity", ids, SamplingParams(), engine.ctx_size, 0)
    engine.scheduler.blocks.grow(seq, len(ids))
    try:
        input_ids, positions, meta = engine.runner.prepare([(seq, len(ids))])
        hidden = engine.runner.model(input_ids, positions, engine.runner.kv_cache, meta, engine.runner.rope)
        logits = engine.runner.model.compute_logits(hidden[:-1]).float()
        target = torch.tensor(ids[1:], device=logits.device)
        return torch.nn.functional.cross_entropy(logits, target, reduction="sum").item(), len(ids) - 1
    finally:
        engine.scheduler.blocks.free_sequence(seq)


def perplexity(model: str, device: str, options: dict, windows: list[list[int]]) -> float:
    """Perplexity of the model with LLM `options` over the token windows ("emulate_gpu": the CPU's
    FP8 products quantize activations where the GPU's would)."""
    from onebit import LLM
    from onebit.kernels import fp8

    options = dict(options)
    fp8.CPU_EMULATES_GPU = options.pop("emulate_gpu", False)
    try:
        llm = LLM(model, device=device, parallel=1, ctx_size=max(map(len, windows)) + 16, cuda_graphs=False,
                  **options)
        total, count = 0.0, 0
        for ids in windows:
            nll, n = window_nll(llm, ids)
            total, count = total + nll, count + n
    finally:
        fp8.CPU_EMULATES_GPU = False
    return math.exp(total / count)


def main() -> None:
    """Run every configuration and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the built-in demo model)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--window", type=int, default=512, help="tokens per window (the demo trained on 512)")
    parser.add_argument("--max-tokens", type=int, default=16384, help="tokens scored at most")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names from: " + ", ".join(CONFIGS))
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    from onebit.models.default_model import default_model_dir
    from onebit.models.tokenizer import Tokenizer

    model = args.model or str(default_model_dir())
    ids = Tokenizer.from_dir(model).encode(held_out_text())[:args.max_tokens]
    windows = [ids[i:i + args.window] for i in range(0, len(ids) - 1, args.window)]
    windows = [w for w in windows if len(w) > 1]
    print(f"{len(ids)} held-out tokens from {', '.join(HELD_OUT)} in {len(windows)} windows of {args.window}")
    rows = []
    for name in args.configs.split(","):
        start = time.perf_counter()
        ppl = perplexity(model, args.device, CONFIGS[name], windows)
        rows.append({"config": name, "perplexity": ppl, "seconds": round(time.perf_counter() - start, 1)})
        print(f"  {name}: {ppl:.4f} ({rows[-1]['seconds']} s)", flush=True)
    base = rows[0]["perplexity"]
    print(f"\n| configuration | perplexity | vs {rows[0]['config']} |\n|---|---|---|")
    for row in rows:
        print(f"| {row['config']} | {row['perplexity']:.4f} | {100 * (row['perplexity'] / base - 1):+.2f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": len(ids), "files": HELD_OUT, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
