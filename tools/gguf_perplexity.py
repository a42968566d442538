"""Held-out perplexity of the built-in demo model, bf16 against GGUF quantizations of it (CPU, the engine).

    PYTHONPATH=. python3 -m tools.gguf_perplexity [--windows 8] [--out DIR]

The demo (onebit/assets/demo) was trained on Python source with 2% of files held out by a hash of
their label (tools/demo_training/corpus.split_by_file); the held-out text here is this machine's
standard-library files that the same split holds out, tokenized with the demo's tokenizer and cut
into windows of 512 tokens. Each model's logits come from the engine's forward (tests/model_probe);
perplexity = exp(mean next-token negative log-likelihood) over all windows.

Quantizations (written with tests/gguf_files.write_gguf):
- Q4_K_M: llama.cpp's recipe (onebit.testing.gguf_encode.q4_k_m_type). The demo's hidden size 384 is
  not a multiple of 256, so as in llama.cpp most matrices fall back (Q4_K -> Q5_0, Q6_K -> Q8_0):
  only ffn_down (rows of 1024) is Q4_K/Q6_K;
- Q4_K+Q8_0: Q4_K wherever rows are whole super-blocks (ffn_down), Q8_0 elsewhere;
- Q4_K+Q4_0: every matrix in 4 bits: Q4_K where rows are whole super-blocks, Q4_0 elsewhere (Q4_0 is
  not a packed type: dequantized at load either way);
- Q8_0 everywhere.
Each quantized file is loaded dequantized and, where it has packed types, packed (the CPU runs the
packed layers through the reference dequantizer: the same values, so the same perplexity).
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import tempfile
from pathlib import Path

import gguf
import torch

from onebit import LLM
from onebit.testing.gguf_encode import q4_k_m_type

Q = gguf.GGMLQuantizationType
DEMO = Path(__file__).resolve().parents[1] / "onebit" / "assets" / "demo"
WINDOW = 512


def held_out_tokens(llm: LLM, windows: int) -> list[list[int]]:
    """`windows` windows of WINDOW + 1 tokens from the standard-library files the demo's split holds out."""
    from tools.demo_training.corpus import split_by_file
    from tools.demo_training.settings import STDLIB

    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages", "__pycache__"} & set(rel.parts) or not 64 <= path.stat().st_size <= 256 * 1024:
            continue
        try:
            docs.append((f"{STDLIB}/{rel.as_posix()}", path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    _, val = split_by_file(docs)
    stream: list[int] = []
    for _, text in val:
        stream += llm.tokenizer.encode(text)
        if len(stream) >= windows * (WINDOW + 1):
            break
    return [stream[i * (WINDOW + 1):(i + 1) * (WINDOW + 1)] for i in range(windows)]


def perplexity(llm: LLM, windows: list[list[int]]) -> float:
    """exp(mean NLL of each next token) over the windows."""
    from tests.model_probe import all_logits

    total, count = 0.0, 0
    for ids in windows:
        logits = all_logits(llm, ids[:-1]).float()
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum")
        total += nll.item()
        count += len(ids) - 1
    return math.exp(total / count)


def recipes(num_layers: int) -> dict:
    """Name -> types(gguf name, tensor) for write_gguf."""
    def q4_k_m(name, t):
        return Q[q4_k_m_type(name, t.shape[-1], num_layers, tied=True)] if t.dim() == 2 else Q.F32

    def q4_k_or_q8_0(name, t):
        return (Q.Q4_K if t.shape[-1] % 256 == 0 else Q.Q8_0) if t.dim() == 2 else Q.F32

    def q4_k_or_q4_0(name, t):
        return (Q.Q4_K if t.shape[-1] % 256 == 0 else Q.Q4_0) if t.dim() == 2 else Q.F32

    return {"Q4_K_M": q4_k_m, "Q4_K+Q8_0": q4_k_or_q8_0, "Q4_K+Q4_0": q4_k_or_q4_0,
            "Q8_0": lambda name, t: Q.Q8_0 if t.dim() == 2 else Q.F32}


def main() -> None:
    from tests.gguf_files import write_gguf

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="where to keep the GGUF files (default: a temp dir)")
    ap.add_argument("--recipes", default=None, help="comma-separated subset of " + ", ".join(recipes(8)))
    args = ap.parse_args()
    torch.manual_seed(0)
    base = LLM(str(DEMO), device="cpu", parallel=1, dtype="float32")
    windows = held_out_tokens(base, args.windows)
    rows = [("bf16 (as shipped)", "-", perplexity(base, windows))]
    del base
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        chosen = args.recipes.split(",") if args.recipes else list(recipes(8))
        for name, types in recipes(8).items():
            if name not in chosen:
                continue
            path = write_gguf(DEMO, out / f"demo-{name}.gguf", types=types)
            kinds = sorted({t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) > 1})
            for packed in (False, True):
                llm = LLM(str(path), device="cpu", parallel=1, dtype="float32", gguf_keep_packed=packed)
                rows.append((f"{name}{' packed' if packed else ''}", "/".join(kinds), perplexity(llm, windows)))
                del llm
    ref = rows[0][2]
    print(f"Held-out perplexity of the demo model, {len(windows)} windows of {WINDOW} tokens (CPU, float32)\n")
    print("| weights | matrix types | perplexity | vs bf16 |\n|---|---|---:|---:|")
    for name, kinds, ppl in rows:
        print(f"| {name} | {kinds} | {ppl:.4f} | {100 * (ppl / ref - 1):+.2f}% |")


if __name__ == "__main__":
    main()
