"""Engine-only benchmark: decode tokens/s by batch size, no HTTP in the way."""

from __future__ import annotations

import gc
import random
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from onebit.bench.gpu_clocks import ClockSampler, describe
from onebit.engine.config import EngineConfig
from onebit.engine.build import build_engine
from onebit.engine.llm_engine import LLMEngine
from onebit.engine.sampling_params import SamplingParams


@dataclass
class OfflineResult:
    """One batch size's figures."""

    batch: int
    decode_tokens_per_s: float
    total_tokens_per_s: float
    prefill_s: float
    decode_s: float
    generated: int
    gpu_clock: dict | None = None  # the sampled GPU's clock over the batch (`run_offline(gpu_clocks=...)`)


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `length` random token ids, avoiding the lowest and highest ids (often specials)."""
    rng = random.Random(seed)
    hi = max(vocab - 300, 11)
    return [[rng.randrange(10, hi) for _ in range(length)] for _ in range(n)]


def run_batch(engine: LLMEngine, batch: int, prompt_tokens: int, max_tokens: int, seed: int) -> OfflineResult:
    """Run `batch` requests together to completion and time prefill and decode steps apart."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompts = random_prompts(batch, prompt_tokens, engine.model_config.vocab_size, seed)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"bench-{seed}-{i}", prompt, params)
    # Prefill ends when every request has its first token; decode is everything after. Timed by
    # tokens arriving rather than by the kind of step, because with overlapped steps a call to
    # step() returns the tokens of the step before the one it queued.
    waiting_first = {f"bench-{seed}-{i}" for i in range(batch)}
    decode_tokens = generated = 0
    start = time.perf_counter()
    decode_start = None
    while engine.has_unfinished():
        deltas = engine.step()
        produced = sum(len(d.token_ids) for d in deltas)
        generated += produced
        if decode_start is not None:
            decode_tokens += produced
        else:
            waiting_first -= {d.request_id for d in deltas if d.token_ids}
            if not waiting_first:
                decode_start = time.perf_counter()
    end = time.perf_counter()
    total = end - start
    prefill_s = (decode_start or end) - start
    decode_s = end - decode_start if decode_start is not None else 0.0
    return OfflineResult(batch, decode_tokens / decode_s if decode_s else 0.0, generated / total,
                         prefill_s, decode_s, generated)


def decode_speeds(engine: LLMEngine, batches: list[int], prompt_tokens: int, max_tokens: int,
                  label: str = "") -> list[float]:
    """Decode tok/s at each batch size (`run_batch`, seeded by the batch size) after a short warm-up
    batch, each printed as it comes (`label B=b: ...`)."""
    run_batch(engine, 4, prompt_tokens, 8, seed=999)
    speeds = []
    for b in batches:
        speeds.append(run_batch(engine, b, prompt_tokens, max_tokens, seed=b).decode_tokens_per_s)
        print(f"{label} B={b}: {speeds[-1]:,.0f} tok/s", flush=True)
    return speeds


def engine_speed_row(label: str, build: Callable[[], LLMEngine], batches: list[int], prompt_tokens: int,
                     max_tokens: int, inspect: Callable[[LLMEngine], None] | None = None) -> str:
    """One markdown row `| label | tok/s at each batch | build s |` for the engine `build()` makes:
    its build timed, `inspect(engine)` run after it when given, its decode speeds measured
    (`decode_speeds`), then the engine freed. A failure prints its traceback and gives a FAILED row,
    so a bench comparing several engines goes on to the next."""
    try:
        start = time.perf_counter()
        engine = build()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        built = time.perf_counter() - start
        if inspect is not None:
            inspect(engine)
        speeds = decode_speeds(engine, batches, prompt_tokens, max_tokens, label)
        row = f"| {label} | " + " | ".join(f"{s:,.0f}" for s in speeds) + f" | {built:.0f} |"
        del engine
    except Exception:
        traceback.print_exc()
        row = f"| {label} | FAILED (traceback above) |"
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row


def run_offline(model: str, batches: list[int], max_tokens: int, prompt_tokens: int, device: str,
                dtype: str, print_fn=print, overlap: bool | None = None,
                gpu_clocks: int | None = None) -> list[OfflineResult]:
    """Load the model once with enough slots for the largest batch; time each batch size after a warm-up.
    `gpu_clocks`: nvidia-smi's index of a GPU whose clock, power and slowdowns are sampled over each batch
    (`onebit.bench.gpu_clocks`) and printed in a last column."""
    config = EngineConfig(model=model, device=device, dtype=dtype, parallel=max(batches),
                          ctx_size=prompt_tokens + max_tokens + 16,
                          max_batch_tokens=max(2048, prompt_tokens * 4), enable_prefix_caching=False,
                          overlap=overlap)
    engine = build_engine(config)
    run_batch(engine, min(batches), prompt_tokens, 8, seed=999)  # warm-up
    results = []
    print_fn(f"model {model} on {engine.device} ({engine.dtype}), prompt {prompt_tokens} tokens, "
             f"{max_tokens} new tokens{', overlapped steps' if engine.overlap else ''}")
    clock = gpu_clocks is not None
    print_fn("| batch | decode tok/s | total tok/s | prefill s | decode s |" + (" GPU clock |" if clock else ""))
    print_fn("|---:|---:|---:|---:|---:|" + ("---|" if clock else ""))
    for b in batches:
        with ClockSampler(gpu_clocks) as sampler:
            r = run_batch(engine, b, prompt_tokens, max_tokens, seed=b)
        if clock:
            r.gpu_clock = sampler.summary()
        results.append(r)
        print_fn(f"| {b} | {r.decode_tokens_per_s:,.1f} | {r.total_tokens_per_s:,.1f} | "
                 f"{r.prefill_s:.2f} | {r.decode_s:.2f} |" + (f" {describe(r.gpu_clock)} |" if clock else ""))
    if results and results[0].decode_tokens_per_s:
        top = results[-1]
        print_fn(f"batch {top.batch} / batch {results[0].batch}: "
                 f"{top.decode_tokens_per_s / results[0].decode_tokens_per_s:.1f}x")
    return results
