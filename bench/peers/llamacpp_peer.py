"""The llama.cpp peer: find the llama-server binary, write the GGUF, check it against our engine.

`greedy_check` is the correctness gate for the numbers: before llama-server is benchmarked, it
must continue a token-id prompt as 1bit does (greedy, fp32) on the same model. With an f32 GGUF
the continuation must be identical. With f16/bf16 matrices llama.cpp computes in other precisions,
and on random weights (a flat distribution) a near tie can flip one argmax and everything after it
differs; there the check feeds llama-server 1bit's own continuation (teacher forcing) and asks,
at every step, for its top tokens: 1bit's token must be among them at every step, and where it is
not llama-server's first choice, a near tie with it (log-probabilities within MAX_GAP). A wrong or
garbage model fails that at once (1bit's token would be any of a whole vocabulary).
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

# Teacher-forced check (f16/bf16 GGUF): at every step 1bit's token must be within llama-server's
# top TOP_K and its log-probability there at most MAX_GAP below llama-server's top-1. Computing in
# bf16 should move these by hundredths (0.007 at most for a tiny model on CPU; not yet measured for
# the 8B shape); the two best of 152k random-weight logits are typically ~0.2 apart, and a token
# drawn at random lies several nats below the best.
TOP_K = 5
MAX_GAP = 0.5

REPO = Path(__file__).resolve().parents[2]


def find_llama_server(explicit: str | None = None) -> str | None:
    """The llama-server to run: `explicit`, else one built by build_llama_server.sh (in .peers) or
    `1bit llama-server --build` (in the user's cache), CUDA builds first, else PATH."""
    from onebit.backends.llama_server_build import built_binaries, default_cache_dir

    if explicit:
        return explicit
    for path in built_binaries([REPO / ".peers", default_cache_dir()]):
        return str(path)
    return shutil.which("llama-server")


def write_gguf(model_dir: str | Path, out_dir: Path, dtype: str) -> Path:
    """The GGUF of `model_dir` in `out_dir`, written by the project's writer (rewritten every run:
    cheap for test models, and never stale)."""
    from onebit.testing.gguf_export import export_gguf

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


def _fingerprint(model_dir: str | Path) -> list:
    """Names, sizes and modification times of the checkpoint files: a new checkpoint, a new reference."""
    from onebit.models.loader import weight_files

    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in weight_files(Path(model_dir))]


def reference(model_dir: str | Path, n: int, device: str, cache: Path | None = None) -> tuple[list[int], list[int]]:
    """(check prompt, 1bit's greedy fp32 continuation of it, `n` tokens) for `model_dir`.

    With `cache`, a JSON file made earlier for the same checkpoint files, prompt and length is reused
    (so it can be computed while something else runs), else the result is written there."""
    from onebit.models.config import ModelConfig

    prompt = check_prompt(ModelConfig.from_dir(Path(model_dir)).vocab_size)
    key = {"prompt": prompt, "n": n, "weights": _fingerprint(model_dir)}
    if cache is not None and cache.is_file():
        saved = json.loads(cache.read_text())
        if {k: saved.get(k) for k in key} == key:
            return prompt, list(saved["tokens"])
    tokens = ours_greedy(model_dir, prompt, n, device)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**key, "tokens": tokens, "model": str(model_dir), "device": device,
                                     "dtype": "float32"}))
    return prompt, tokens


def _reference_main() -> None:
    """`llamacpp_peer.py MODEL_DIR PROMPT_JSON N DEVICE`: print 1bit's greedy fp32 continuation as a
    JSON list (the child process of ours_greedy). `llamacpp_peer.py reference MODEL_DIR N DEVICE FILE`:
    compute the check reference into FILE ahead of `run_peers.py --check-reference FILE`."""
    if sys.argv[1:2] == ["reference"]:
        parser = argparse.ArgumentParser(description="write 1bit's reference continuation for the llama.cpp check")
        parser.add_argument("model_dir")
        parser.add_argument("n", type=int)
        parser.add_argument("device")
        parser.add_argument("file", type=Path)
        args = parser.parse_args(sys.argv[2:])
        prompt, tokens = reference(args.model_dir, args.n, args.device, args.file)
        print(json.dumps({"prompt": prompt, "tokens": tokens}))
        return
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


def _completion(root: str, prompt: list[int], n: int, n_probs: int = 0) -> dict:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True, "stream": False}
    if n_probs:
        body["n_probs"] = n_probs  # top tokens by the model's own (pre-sampling) probabilities
    resp = httpx.post(f"{root}/completion", json=body, timeout=120)
    resp.raise_for_status()
    return resp.json()


def llama_greedy(root: str, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation of the token-id `prompt` by a running llama-server at `root` (no /v1)."""
    return list(_completion(root, prompt, n)["tokens"])


def llama_top(root: str, prompt: list[int], k: int) -> list[tuple[int, float]]:
    """llama-server's top `k` (token id, logprob) for the token after `prompt`, best first."""
    probs = _completion(root, prompt, 1, k)["completion_probabilities"][0]["top_logprobs"]
    return [(int(p["id"]), float(p["logprob"])) for p in probs]


def greedy_check(root: str, prompt: list[int], ours: list[int], exact: bool = True) -> tuple[bool, str]:
    """(pass, one line saying what was found) for llama-server at `root` against our engine's
    fp32 greedy continuation `ours` of the token-id `prompt`.

    exact: llama-server's own greedy continuation must equal `ours` (f32 GGUF). Otherwise (f16/bf16)
    after prompt + ours[:i], for every i, ours[i] must be in llama-server's top TOP_K with a
    log-probability at most MAX_GAP below its top-1; how long the two free-running continuations
    agree is reported either way."""
    n = len(ours)
    try:
        theirs = llama_greedy(root, prompt, n)
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return False, f"greedy check failed: llama-server /completion: {exc!r}"
    lead = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    if theirs == ours:
        return True, f"greedy check: llama-server and 1bit agree on all {n} tokens after a {len(prompt)}-token prompt"
    if exact:
        return False, (f"GREEDY MISMATCH at token {lead}: 1bit {ours} vs llama-server {theirs} "
                       f"(prompt {prompt})")
    ranks, gaps = [], []
    try:
        for i, token in enumerate(ours):
            top = llama_top(root, prompt + ours[:i], TOP_K)
            ids = [t for t, _ in top]
            ranks.append(ids.index(token) + 1 if token in ids else None)
            if ranks[-1] and ranks[-1] > 1:
                gaps.append(top[0][1] - top[ranks[-1] - 1][1])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        return False, f"greedy check failed: llama-server /completion with n_probs: {exc!r}"
    top1 = sum(r == 1 for r in ranks)
    outside = [i for i, r in enumerate(ranks) if r is None]
    found = (f"free-running, llama-server and 1bit agree on the first {lead} of {n} tokens after a "
             f"{len(prompt)}-token prompt; fed 1bit's tokens, 1bit's token is llama-server's top-1 at "
             f"{top1}/{n} steps")
    if gaps:
        found += (f", otherwise its #{max((r for r in ranks if r), default=1)} at most, log-probability "
                  f"at most {max(gaps):.3f} below its top-1")
    if outside or (gaps and max(gaps) > MAX_GAP):
        why = (f"outside llama-server's top-{TOP_K} at steps {outside}" if outside
               else f"more than {MAX_GAP} below its top-1")
        return False, (f"GREEDY MISMATCH: {found}; 1bit's token is {why} "
                       f"(1bit {ours} vs llama-server {theirs}, prompt {prompt})")
    return True, (f"greedy check (bf16/f16: 1bit's token within llama-server's top-{TOP_K} and {MAX_GAP} of "
                  f"its top-1 log-probability at every step): {found}")


if __name__ == "__main__":
    _reference_main()
