"""One device call: check the engine on CUDA against transformers, then time it on a Qwen3-8B shape.

Usage on the GPU machine (see docs/perf.md for the full command with carried wheels):
    PYTHONPATH=. python3 bench/gpu.py [--batches 1,8,32,64,256] [--out DIR]
Prints one table last. Weights are random (load_format dummy), never zeros.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from make_shape_model import SHAPES, hf_state_dict  # noqa: E402  (bench/ is the script directory)

QWEN3_8B = SHAPES["qwen3-8b"]


def check_tiny_on_cuda(work: Path) -> list[str]:
    """fp32 logits and greedy output of a tiny model on CUDA against transformers on CUDA."""
    from transformers import AutoModelForCausalLM

    from onebit import LLM, SamplingParams
    from onebit.testing.tiny import make_tiny_model
    torch.backends.cuda.matmul.allow_tf32 = False
    path = make_tiny_model(work / "tiny", arch="qwen3", layers=4, hidden=128, vocab=1024)
    llm = LLM(str(path), device="cuda", dtype="float32", parallel=4)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    ids = llm.tokenizer.encode("def fibonacci(n):\n    return n if n < 2 else")
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0]
    with torch.no_grad():
        gen = ref.generate(torch.tensor([ids], device="cuda"), max_new_tokens=64, min_new_tokens=64,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
    same = out.token_ids == gen[0, len(ids):].tolist()
    batch = llm.generate([ids] * 3 + [ids[:5]], SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    # Overlapped steps against plain ones: greedy, seeded sampling with logprobs, a stop token, a short one.
    mixed = [SamplingParams(temperature=0, max_tokens=64, ignore_eos=True),
             SamplingParams(temperature=0.8, seed=5, max_tokens=40, ignore_eos=True, logprobs=2),
             SamplingParams(temperature=0, max_tokens=48, stop_token_ids=[out.token_ids[20]]),
             SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)]
    prompts = [ids, ids[:7], ids, ids[3:]]
    overlapped = LLM(str(path), device="cuda", dtype="float32", parallel=4, overlap=True)
    plain_out = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, mixed)]
    same_overlap = plain_out == [(o.token_ids, o.finish_reason) for o in overlapped.generate(prompts, mixed)]
    return [f"tiny fp32 CUDA greedy 64 == transformers: {same}",
            f"tiny fp32 CUDA batch of 4 == alone: {batch[0].token_ids == out.token_ids}",
            f"tiny fp32 CUDA overlapped steps == plain steps (mixed stops, seeded sampling): {same_overlap}"]


def check_8b_logits(engine) -> str:
    """bf16 logits of our engine against transformers' Qwen3 on the same random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from onebit.engine.sequence import Sequence
    from onebit.engine.sampling_params import SamplingParams
    cfg = AutoConfig.from_pretrained(engine.model_path)
    with torch.device("cuda"):
        ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    missing, unexpected = ref.load_state_dict(hf_state_dict(engine.runner.model), strict=False)
    ids = torch.randint(10, 150000, (128,), generator=torch.Generator().manual_seed(1)).tolist()
    seq = Sequence("probe", ids, SamplingParams(), engine.ctx_size, 0)
    engine.scheduler.blocks.grow(seq, len(ids))
    with torch.inference_mode():
        x, pos, meta = engine.runner.prepare([(seq, len(ids))])
        ours = engine.runner.model.compute_logits(engine.runner.model(x, pos, engine.runner.kv_cache, meta,
                                                                      engine.runner.rope)).float()
        theirs = ref(torch.tensor([ids], device="cuda")).logits[0].float()
    engine.scheduler.blocks.free_sequence(seq)
    rel = ((ours - theirs).norm() / theirs.norm()).item()
    agree = (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()
    del ref
    torch.cuda.empty_cache()
    return (f"8B-shape bf16 logits vs transformers: rel err {rel:.2e}, argmax agreement {agree:.3f} "
            f"(missing {len(missing)}, unexpected {len(unexpected)})")


def hf_continuous_batching(engine, batches, prompt_tokens: int, max_tokens: int) -> list[str]:
    """transformers' own continuous batching (`generate_batch`) on the same weights, total tok/s."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from onebit.bench.offline import random_prompts
    cfg = AutoConfig.from_pretrained(engine.model_path)
    with torch.device("cuda"):
        ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ref.load_state_dict(hf_state_dict(engine.runner.model), strict=False)
    rows = []
    for b in batches:
        gen = GenerationConfig(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=-1, pad_token_id=0, max_batch_tokens=8192, num_blocks=4096,
                               block_size=32)
        prompts = random_prompts(b, prompt_tokens, cfg.vocab_size, seed=b)
        ref.generate_batch(inputs=prompts[:2], generation_config=gen)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = ref.generate_batch(inputs=prompts, generation_config=gen)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        made = sum(len(r.generated_tokens) for r in out.values())
        rows.append(f"| transformers CB | {b} | - | {made / dt:,.0f} | - | - | - |")
        print(rows[-1], flush=True)
    del ref
    torch.cuda.empty_cache()
    return rows


def time_replays(engine, sizes=(1, 8, 64, 256)) -> str:
    """Median time of a bare graph replay per batch size: the GPU's share of a decode step."""
    graphs = engine.runner.graphs
    if graphs is None:
        return "no CUDA graphs"
    parts = []
    for b in sizes:
        if b not in graphs.graphs:
            continue
        graph = graphs.graphs[b][0]
        times = []
        for _ in range(30):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        parts.append(f"B={b}: {times[len(times) // 2]:.2f} ms")
    return "graph replay alone (median of 30): " + ", ".join(parts)


def fp8_choice_summary(report: list[str]) -> list[str]:
    """One line per row count of the FP8 calibration ("fp8 NAME NxK, M row(s): KIND ..."): how many
    products each kind won there."""
    by_rows: dict[int, dict[str, int]] = {}
    for line in report:
        match = re.match(r"fp8 \S+ \d+x\d+(?: \(e4m3 \w+ input\))?, (\d+) row\(s\): (\S+)", line)
        if match:
            kinds = by_rows.setdefault(int(match[1]), {})
            kinds[match[2]] = kinds.get(match[2], 0) + 1
    return [f"fp8 products won at {rows} row(s): " + ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items()))
            for rows, kinds in sorted(by_rows.items())]


def main() -> int:
    """Run the checks and the timings; print the table last."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64,256")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument("--variants", default="graphs,graphs-overlap",
                    help="engine variants to time: eager, graphs (CUDA graphs: the default engine), "
                         "graphs-overlap (and each step queued before the last one's tokens reach the host), "
                         "'-fp8' appended: decoder weights quantized to FP8 (--quantize fp8), "
                         "'-cublas' appended to either: no Triton kernels for few-row products, "
                         "'-det' appended: --deterministic (batch-invariant kernels)")
    ap.add_argument("--hf-batches", default="8,32,64", help="transformers continuous batching sizes ('' to skip)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    lines = [f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}"]
    work = Path(tempfile.mkdtemp())
    try:
        lines += check_tiny_on_cuda(work)
    except Exception:
        traceback.print_exc()
        lines.append("tiny CUDA check FAILED (traceback above)")
    from onebit.bench.offline import run_batch
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig
    big = work / "qwen3-8b-shape"
    big.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(work / "tiny" / f, big / f)
    (big / "config.json").write_text(json.dumps(QWEN3_8B))
    rows = ["| variant | batch | decode tok/s | total tok/s | prefill s | decode s | ms/decode step |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    results, calibration = [], {}
    for variant in args.variants.split(","):
        t0 = time.perf_counter()
        engine = build_engine(EngineConfig(
            model=str(big), device="cuda", dtype="bfloat16", parallel=max(batches),
            ctx_size=args.prompt_tokens + args.max_tokens + 16, max_batch_tokens=8192,
            enable_prefix_caching=False, load_format="dummy", cuda_graphs=variant.startswith("graphs"),
            overlap="-overlap" in variant, triton_gemv="-cublas" not in variant,
            quantize="fp8" if "-fp8" in variant else None, deterministic="-det" in variant))
        torch.cuda.synchronize()
        lines.append(f"8B-shape engine ({variant}) built in {time.perf_counter() - t0:.1f}s")
        report = engine.runner.gemv_report  # the calibration (every timing in the json)
        if report:
            calibration[variant] = report
            # per shape, the rows Triton won; for FP8, which kind won at each row count
            lines += [f"{variant}: {line}" for line in report if line.startswith("few-row choice")]
            lines += [f"{variant}: {line}" for line in fp8_choice_summary(report)]
        if variant == "graphs":
            try:
                lines.append(check_8b_logits(engine))
            except Exception:
                traceback.print_exc()
                lines.append("8B logits check FAILED (traceback above)")
        run_batch(engine, 4, args.prompt_tokens, 8, seed=999)
        if variant == "graphs":
            lines.append(time_replays(engine))
        for b in batches:
            r = run_batch(engine, b, args.prompt_tokens, args.max_tokens, seed=b)
            results.append({"variant": variant, **r.__dict__})
            steps = args.max_tokens - 1
            rows.append(f"| {variant} | {b} | {r.decode_tokens_per_s:,.0f} | {r.total_tokens_per_s:,.0f} | "
                        f"{r.prefill_s:.2f} | {r.decode_s:.2f} | {1000 * r.decode_s / steps:.1f} |")
            print(rows[-1], flush=True)
        if variant == "graphs" and args.hf_batches:
            try:
                rows += hf_continuous_batching(engine, [int(b) for b in args.hf_batches.split(",")],
                                               args.prompt_tokens, args.max_tokens)
            except Exception:
                traceback.print_exc()
                lines.append("transformers continuous batching FAILED (traceback above)")
        del engine
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "gpu_bench.json").write_text(json.dumps({"lines": lines, "results": results,
                                                                     "calibration": calibration}, indent=1))
    print("\n".join(lines + rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
