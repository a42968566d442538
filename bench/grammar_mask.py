"""Grammar mask cost per decode step at 1, 8 and 64 constrained rows (llguidance).

    PYTHONPATH=. python bench/grammar_mask.py [--device cuda] [--model DIR] [--steps 200]

Each row follows its own JSON schema matcher: per step the masks of all rows are computed on the
host in one parallel call (GrammarMasker.fill), then sent to the device, unpacked and applied to a
[rows, vocab] logits tensor in one operation (GrammarMasker.allowed + torch.where, as the sampler
does). Each row then takes a random allowed token, so the matchers move through the grammar as in
serving (a matcher that finishes starts over). Prints the median milliseconds per step of each part.
The model directory only supplies the tokenizer (default: the built-in model, 8k vocabulary). Mask
cost grows with the vocabulary: `--vocab 151936` builds a synthetic byte-level tokenizer of that
size instead (random pieces of 1-12 characters over letters, digits, spaces and JSON punctuation),
a stand-in for a Qwen-size vocabulary when no such model is at hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import tokenizers
import torch

from onebit.engine.grammar import GrammarCompiler, GrammarMasker
from onebit.models.default_model import default_model_dir
from onebit.models.tokenizer import Tokenizer, byte_alphabet
from onebit.protocol.grammar import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                  "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                 "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "tags", "home"],
    "additionalProperties": False,
}


def synthetic_tokenizer(size: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE tokenizer of `size` tokens: the 256 bytes, random multi-character pieces, and
    an end token."""
    rng = np.random.default_rng(seed)
    alphabet = byte_alphabet()
    chars = [alphabet[b] for b in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:{}[]\"'"]
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    while len(vocab) < size - 1:
        piece = "".join(rng.choice(chars, size=int(rng.integers(2, 13))))
        vocab.setdefault(piece, len(vocab))
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    return Tokenizer(tok, eos_token="<|end|>")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(compiler: GrammarCompiler, masker: GrammarMasker, rows: int, steps: int, vocab: int,
            rng: np.random.Generator) -> tuple[float, float]:
    """Median (host fill ms, device apply ms) per step for `rows` constrained rows."""
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    states = [compiler.start(spec) for _ in range(rows)]
    logits = torch.randn(rows, vocab, device=masker.device)
    fills, applies = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        bits = masker.fill(states)
        t1 = time.perf_counter()
        masked = torch.where(masker.allowed(bits), logits, masker.minus_inf)
        _sync(masker.device)
        t2 = time.perf_counter()
        del masked
        fills.append(t1 - t0)
        applies.append(t2 - t1)
        unpacked = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        for i, state in enumerate(states):
            choices = np.flatnonzero(unpacked[i])
            token = int(rng.choice(choices))
            state.accept(token)
            if state.done or token in compiler_eos(compiler):
                states[i] = compiler.start(spec)
    return statistics.median(fills) * 1e3, statistics.median(applies) * 1e3


def compiler_eos(compiler: GrammarCompiler) -> set[int]:
    """The end tokens the compiler's tokenizer knows."""
    return set(compiler.tokenizer.eos_tokens)


def parse_arguments(description: str) -> argparse.Namespace:
    """The options both mask benches take (this one and grammar_mask_xgrammar.py); applies --threads."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="a model directory (its tokenizer); default: the built-in model")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--vocab", type=int, default=None, help="a synthetic tokenizer of this many tokens")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def main() -> None:
    """Parse arguments, measure each row count, print the table."""
    args = parse_arguments(__doc__)
    device = torch.device(args.device)
    if args.vocab:
        tokenizer = synthetic_tokenizer(args.vocab)
    else:
        tokenizer = Tokenizer.from_dir(args.model or default_model_dir())
    vocab = tokenizer.vocab_size
    compiler = GrammarCompiler(tokenizer, vocab, tokenizer.eos_token_ids)
    masker = GrammarMasker(vocab, device)
    rng = np.random.default_rng(0)
    measure(compiler, masker, 8, 20, vocab, rng)  # warm-up: compile, first allocations
    print(f"grammar mask per step, vocabulary {vocab}, device {device}, {torch.get_num_threads()} torch threads")
    print("| rows | host fill (ms) | upload + apply (ms) | total (ms) |")
    print("|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        fill, apply = measure(compiler, masker, rows, args.steps, vocab, rng)
        print(f"| {rows} | {fill:.3f} | {apply:.3f} | {fill + apply:.3f} |")


if __name__ == "__main__":
    main()
