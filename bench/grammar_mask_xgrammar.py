"""Grammar mask cost per decode step at 1, 8 and 64 constrained rows, with xgrammar (for #15).

    PYTHONPATH=XGR_SITE:. python bench/grammar_mask_xgrammar.py [--threads 1] [--vocab 151936]

The xgrammar counterpart of bench/grammar_mask.py (llguidance), on the same workload: the same JSON
schema (compact separators, no free whitespace, as the llguidance compiler is configured), the same
tokenizer (the built-in model's, or the same synthetic byte-level one with `--vocab`). xgrammar is
not a dependency of the project: install it into a separate directory (XGR_SITE above) with
`pip install --no-deps --target XGR_SITE xgrammar==0.2.8 apache-tvm-ffi`; its other requirements
(torch, transformers, triton, pydantic, numpy) are already in the project's environment.

Per step: every row's mask is filled into one allocated bitmask by one BatchGrammarMatcher call
("host fill"), the bitmask is moved to the device and applied to a [rows, vocab] logits tensor with
apply_token_bitmask_inplace ("upload + apply"); each row then accepts a random allowed token (a
matcher that terminates is reset). Prints the median milliseconds per step of each part.
"""

from __future__ import annotations

import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import xgrammar

from onebit.models.default_model import default_model_dir
from onebit.models.tokenizer import Tokenizer

# The llguidance bench's workload (its schema and synthetic tokenizer), imported from beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grammar_mask import SCHEMA, parse_arguments, synthetic_tokenizer


def tokenizer_info(tokenizer: Tokenizer) -> xgrammar.TokenizerInfo:
    """xgrammar's view of `tokenizer`: the raw bytes of every token and its end tokens."""
    pieces = tokenizer.token_bytes
    if pieces is None:
        raise SystemExit("this bench needs a byte-level BPE tokenizer")
    return xgrammar.TokenizerInfo(pieces, xgrammar.VocabType.RAW, vocab_size=tokenizer.vocab_size,
                                  stop_token_ids=sorted(tokenizer.eos_token_ids))


def measure(grammar: xgrammar.CompiledGrammar, batch: xgrammar.BatchGrammarMatcher, rows: int, steps: int,
            vocab: int, device: torch.device, rng: np.random.Generator) -> tuple[float, float]:
    """Median (host fill ms, upload + apply ms) per step for `rows` constrained rows."""
    matchers = [xgrammar.GrammarMatcher(grammar) for _ in range(rows)]
    bitmask = xgrammar.allocate_token_bitmask(rows, vocab)
    logits = torch.randn(rows, vocab, device=device)
    fills, applies = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch.batch_fill_next_token_bitmask(matchers, bitmask)
        t1 = time.perf_counter()
        xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(device, non_blocking=True))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        fills.append(t1 - t0)
        applies.append(t2 - t1)
        unpacked = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        tokens = [int(rng.choice(np.flatnonzero(unpacked[i]))) for i in range(rows)]
        accepted = xgrammar.BatchGrammarMatcher.batch_accept_token(matchers, tokens)
        assert all(accepted), "a token from the mask was refused"
        for m in matchers:
            if m.is_terminated():
                m.reset()
    return statistics.median(fills) * 1e3, statistics.median(applies) * 1e3


def main() -> None:
    """Parse arguments, measure each row count, print the table."""
    args = parse_arguments(__doc__)
    device = torch.device(args.device)
    tokenizer = synthetic_tokenizer(args.vocab) if args.vocab else Tokenizer.from_dir(args.model or default_model_dir())
    vocab = tokenizer.vocab_size
    compiler = xgrammar.GrammarCompiler(tokenizer_info(tokenizer))
    t0 = time.perf_counter()
    grammar = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
    compile_ms = (time.perf_counter() - t0) * 1e3
    batch = xgrammar.BatchGrammarMatcher()  # "auto" threads, as llguidance's executor by default
    rng = np.random.default_rng(0)
    measure(grammar, batch, 8, 20, vocab, device, rng)  # warm-up: first allocations
    print(f"xgrammar {importlib.metadata.version('xgrammar')} mask per step, vocabulary {vocab}, device {device}, "
          f"{torch.get_num_threads()} torch threads, schema compiled in {compile_ms:.0f} ms")
    print("| rows | host fill (ms) | upload + apply (ms) | total (ms) |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        fill, apply = measure(grammar, batch, rows, args.steps, vocab, device, rng)
        print(f"| {rows} | {fill:.3f} | {apply:.3f} | {fill + apply:.3f} |")


if __name__ == "__main__":
    main()
