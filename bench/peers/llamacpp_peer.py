"""The llama.cpp peer: find the llama-server binary, write the GGUF, check it against our engine.

`greedy_check` is the correctness gate for the numbers: before llama-server is benchmarked, it
must continue a token-id prompt exactly as 1bit does (greedy, fp32 weights) on the same model.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
# Where bench/peers/build_llama_server.sh puts its builds.
BUILT = [REPO / ".peers" / "build-cuda" / "bin" / "llama-server", REPO / ".peers" / "build-cpu" / "bin" / "llama-server"]


def find_llama_server(explicit: str | None = None) -> str | None:
    """The llama-server to run: `explicit`, else one built by build_llama_server.sh, else PATH."""
    if explicit:
        return explicit
    for path in BUILT:
        if path.is_file():
            return str(path)
    return shutil.which("llama-server")


def write_gguf(model_dir: str | Path, out_dir: Path, dtype: str) -> Path:
    """The GGUF of `model_dir` in `out_dir`, written by the project's writer (rewritten every run:
    cheap for test models, and never stale)."""
    from onebit.models.gguf_export import export_gguf

    return export_gguf(model_dir, out_dir / f"{Path(model_dir).resolve().name}-{dtype}.gguf", dtype)


def check_prompt(vocab_size: int, length: int = 12, seed: int = 0) -> list[int]:
    """A fixed token-id prompt of ordinary (non-special) tokens, the same for both servers."""
    rng = random.Random(seed)
    return [rng.randrange(32, min(vocab_size, 250)) for _ in range(length)]


def ours_greedy(model_dir: str | Path, prompt: list[int], n: int, device: str) -> list[int]:
    """Greedy continuation of `prompt` by our engine in fp32, computed in a child process so that
    no engine (threads, device memory) stays in the bench process while servers are measured."""
    cmd = [sys.executable, __file__, str(model_dir), json.dumps(prompt), str(n), device]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"1bit reference generation failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _reference_main() -> None:
    parser = argparse.ArgumentParser(description="print 1bit's greedy fp32 continuation as a JSON list")
    parser.add_argument("model_dir")
    parser.add_argument("prompt", type=json.loads)
    parser.add_argument("n", type=int)
    parser.add_argument("device")
    args = parser.parse_args()
    from onebit import LLM, SamplingParams

    llm = LLM(args.model_dir, device=args.device, dtype="float32", parallel=1)
    out = llm.generate([args.prompt], SamplingParams(temperature=0, max_tokens=args.n, ignore_eos=True))
    print(json.dumps(list(out[0].token_ids)))


def llama_greedy(root: str, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation of the token-id `prompt` by a running llama-server at `root` (no /v1)."""
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "stream": False}
    resp = httpx.post(f"{root}/completion", json=body, timeout=120)
    resp.raise_for_status()
    return list(resp.json()["tokens"])


def greedy_check(root: str, prompt: list[int], ours: list[int]) -> tuple[bool, str]:
    """(agree, one line saying so) for llama-server at `root` against our engine's continuation
    `ours` of the token-id `prompt`."""
    n = len(ours)
    try:
        theirs = llama_greedy(root, prompt, n)
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return False, f"greedy check failed: llama-server /completion: {exc!r}"
    if theirs == ours:
        return True, f"greedy check: llama-server and 1bit agree on all {n} tokens after a {len(prompt)}-token prompt"
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return False, (f"GREEDY MISMATCH at token {first}: 1bit {ours} vs llama-server {theirs} "
                   f"(prompt {prompt})")


if __name__ == "__main__":
    _reference_main()
