"""Where a decode step's time goes: kernels by kind, GPU-busy time against the step's wall time.

    PYTHONPATH=. python3 bench/gpu_step_profile.py [--out DIR] [--batches 1,8,64] [--engines bf16,fp8]
        [--shape qwen3-8b] [--steps 20] [--device cuda] [--no-pdl] [--prefill 10]

One device call (~2 min, no wheels). For each engine (bf16; fp8 = `--quantize fp8` with its FP8
head) on the shape with random weights (CUDA graphs, overlapped steps), and each batch size: the
requests are prefilled first, then `--steps` decode steps run under torch.profiler; the largest
batch runs once more with a request ending and a new one arriving every `--turnover` steps, as
in a closed loop, where the server's 64-stream step took 8.7 ms against 5.6 decoding alone
(perf-history, session 6). Per step it
reports the wall time, the time kernels ran (their durations summed: one stream, so no overlap),
the gap between the two (host work the GPU waited for, launch latency), the host's time blocked in
synchronize calls (near the step's time: the GPU bounds it; near 0: the host does), the weight-read floor
(weight bytes at 4.24 TB/s) and the kernel time by kind: GEMM (cuBLAS / CUTLASS), the few-row
Triton products, attention, norms, rotary, sampling, copies, other. The twelve longest kernels
follow. With `--prefill N`, one step that prefills N 128-token prompts while nothing decodes (the
eager steps of a served closed loop) is timed too: the host's time until it was queued, until the GPU
finished, and its kernels' time. This is the profile #19 asks for ("B=1 at 85% of bandwidth": which kernels stand between
the step and the weight-read floor) and #20's (FP8 at 324 tok/s against a 490 floor).

On the CPU (`--device cpu --shape qwen3-tiny`) the same tables come from CPU operators, which checks
the script, not the machine.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import make_shape_model  # noqa: E402  (bench/ is the script directory)

from onebit import SamplingParams  # noqa: E402
from onebit.bench.gpu_clocks import ClockSampler  # noqa: E402
from onebit.bench.offline import random_prompts  # noqa: E402
from onebit.engine.build import build_engine  # noqa: E402
from onebit.engine.config import EngineConfig  # noqa: E402
from onebit.kernels import pdl  # noqa: E402

COPY_BANDWIDTH = 4.24e12  # H200 device-to-device copy, bytes/s (docs/perf.md)
PROMPT = 128
# (kind, substrings of a kernel or operator name, lower case); the first kind that matches wins.
KINDS = [
    ("attention", ("attn", "attention", "decode_kernel", "decode_split", "prefill", "flash", "paged", "split_kv", "_kv_")),
    ("few-row triton", ("gemv", "skinny", "split_k", "_reduce_kernel", "weight_only", "few_row", "repacked", "fp8_fast", "_fp8")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "sm90", "scaled_mm", "aten::mm", "aten::addmm",
              "aten::linear", "aten::matmul", "aten::bmm")),
    ("norm", ("rms", "norm")),
    ("rotary", ("rope", "rotary")),
    ("sampling", ("argmax", "softmax", "topk", "sort", "sample", "multinomial", "gumbel", "exponential")),
    ("copy", ("memcpy", "memset", "copy", "cat", "index", "gather", "scatter", "fill")),
]


def kind_of(name: str) -> str:
    """The kind of a kernel or operator, by its name."""
    low = name.lower()
    for kind, needles in KINDS:
        if any(n in low for n in needles):
            return kind
    return "other"


def weight_bytes(engine) -> int:
    """Bytes of every parameter and buffer of the model: what one decode step reads at least."""
    model = engine.runner.model
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def gguf_file(shape: Path, recipe: str, device: str) -> Path:
    """The shape model's random weights written as a GGUF file of `recipe` (Q4_K_M or Q8_0; needs the
    gguf package: carry .whl), beside it."""
    from bench.gpu_gguf_quant import write_gguf_files
    from bench.make_shape_model import fill_vocab

    fill_vocab(shape)
    return write_gguf_files(shape, shape.parent, [recipe], device)[recipe]


def kernel_times(averages, cuda: bool) -> tuple[dict[str, float], int]:
    """A profile's seconds by kernel name (on the CPU: by operator, self time) and how many ran, from its
    `key_averages()`. On CUDA kernels only: an operator's device time is its kernels', counted once there."""
    by_name: dict[str, float] = defaultdict(float)
    count = 0
    for entry in averages:
        if cuda and entry.device_type != torch.autograd.DeviceType.CUDA:
            continue
        seconds = (entry.device_time_total if cuda else entry.self_cpu_time_total) / 1e6
        count += entry.count
        if seconds > 0:
            by_name[entry.key] += seconds
    return by_name, count


# The CUDA runtime calls in which the host waits for the GPU (a download's event, a stream or the device).
SYNC_CALLS = {"cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize"}


def profile_decode(engine, batch: int, steps: int, device: str, turnover: int = 0) -> dict:
    """Prefill `batch` requests, then profile `steps` decode steps. With `turnover` N > 0, every N
    steps the oldest request ends and a new one arrives, whose 128-token prompt rides along with
    the decodes (a closed loop at 64 streams and 128 new tokens turns one request over every 2
    steps). Returns wall and kernel times per step (seconds), the kernel time by kind and name, and GPU 0's
    mean SM clock over the profiled steps (MHz; None without nvidia-smi) and the host's time blocked on the GPU
    per step (`SYNC_CALLS`; the final synchronize included)."""
    params = SamplingParams(temperature=0.0, max_tokens=steps + 16, ignore_eos=True)
    ids = [f"profile-{batch}-{i}" for i in range(batch)]
    fresh = random_prompts(batch + steps, PROMPT, engine.model_config.vocab_size, seed=batch)
    for rid, prompt in zip(ids, fresh[:batch]):
        engine.add_request(rid, prompt, params)
    waiting = set(ids)
    while waiting:  # until every request has its first token: from here on, decode steps only
        waiting -= {d.request_id for d in engine.step() if d.token_ids}
    for _ in range(3):
        engine.step()
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with ClockSampler() as clocks, profile(activities=activities) as prof:
        start = time.perf_counter()
        for i in range(steps):
            if turnover and i % turnover == 0:
                engine.abort(ids.pop(0))
                ids.append(f"profile-{batch}-{batch + i}")
                engine.add_request(ids[-1], fresh[batch + i], params)
            engine.step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    averages = prof.key_averages()
    by_name, count = kernel_times(averages, cuda)
    launches = count if cuda else 0  # the table's "kernels a step": none on the CPU
    by_kind: dict[str, float] = defaultdict(float)
    for name, seconds in by_name.items():
        by_kind[kind_of(name)] += seconds
    clock = clocks.summary()
    waits = sum(e.self_cpu_time_total for e in averages if e.key in SYNC_CALLS) / 1e6
    return {"wall": wall / steps, "busy": sum(by_name.values()) / steps, "launches": launches / steps,
            "host_waits": waits / steps,
            "sm_mhz": clock["sm_mhz_mean"] if clock else None,
            "by_kind": {k: v / steps for k, v in by_kind.items()},
            "by_name": {k: v / steps for k, v in by_name.items()}}


def profile_prefill(engine, prompts: int, device: str) -> dict:
    """One step that prefills `prompts` prompts of PROMPT tokens while nothing decodes (a closed loop's
    wave: the server's eager steps, perf.md's #19 item), run unprofiled three times (the first of a new
    token count pays one-off costs: allocations, kernel picks) for the host's time until `step()` returned
    with the step queued (with overlap it does not wait for the GPU, unless something in the forward does)
    and until the GPU finished; then profiled, for the kernels' time and the host operators that took the
    most of its own time. Seconds, a count, and (name, seconds) pairs."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    fresh = iter(random_prompts(5 * prompts, PROMPT, engine.model_config.vocab_size, seed=prompts + 7))
    cuda = device == "cuda"

    def one_step(tag: str) -> tuple[float, float]:
        for i in range(prompts):
            engine.add_request(f"prefill-{tag}-{i}", next(fresh), params)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        engine.step()
        queued = time.perf_counter() - start
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        while engine.has_unfinished():
            engine.step()
        return queued, wall

    first_queued, _ = one_step("first")
    queued, wall = min(one_step("again-1"), one_step("again-2"))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        one_step("profiled")
    averages = prof.key_averages()
    by_name, launches = kernel_times(averages, cuda)
    host = sorted(((e.key, e.self_cpu_time_total / 1e6) for e in averages), key=lambda kv: -kv[1])
    return {"first_queued": first_queued, "queued": queued, "wall": wall, "busy": sum(by_name.values()),
            "launches": launches, "host_top": host[:12]}


def main() -> None:
    """Parse, build each engine, profile each batch size, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--engines", default="bf16,fp8", help="bf16, fp8 (--quantize fp8), Q4_K_M or Q8_0 (a GGUF "
                    "file of the random weights, kept packed)")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=pdl.enabled,
                    help="programmatic dependent launch (onebit.kernels.pdl; default: the engine's, on)")
    ap.add_argument("--prefill", type=int, default=0,
                    help="also time one step prefilling this many 128-token prompts with nothing decoding (0: not)")
    ap.add_argument("--turnover", type=int, default=2,
                    help="also profile the largest batch with a request ending and one arriving every N steps (0: not)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    pdl.enabled = args.pdl
    shape = make_shape_model(Path(tempfile.mkdtemp()) / "shape", args.shape)
    kinds = [k for k, _ in KINDS] + ["other"]
    # kernels a step: the launches the gap is spread over (its us per kernel says what fusing one saves)
    # SM MHz: the clock the steps ran at (a GPU at its power cap runs 64+ rows at 13-22% under its one-row clock)
    # host waits ms: the host blocked on the GPU a step (its synchronize calls): near the step's time, the GPU
    # bounds the step; near 0 with a gap, the host does
    lines = ["| engine | B | step ms | kernels ms | gap ms | host waits ms | kernels a step | gap us per kernel | "
             "weight floor ms | SM MHz | " + " | ".join(kinds) + " |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(kinds)]
    tops, prefill_lines, prefill_hosts = [], [], []
    for label in args.engines.split(","):
        gguf = label in ("Q4_K_M", "Q8_0")
        engine = build_engine(EngineConfig(
            model=str(gguf_file(shape, label, args.device) if gguf else shape), device=args.device,
            dtype="bfloat16" if args.device == "cuda" else "float32",
            parallel=max(batches), ctx_size=PROMPT + args.steps + 64, max_batch_tokens=8192,
            enable_prefix_caching=False, load_format="auto" if gguf else "dummy", cuda_graphs=args.device == "cuda",
            overlap=True, quantize="fp8" if label == "fp8" else None, gguf_keep_packed=True if gguf else None))
        floor = weight_bytes(engine) / COPY_BANDWIDTH
        runs = [(b, 0) for b in batches] + ([(max(batches), args.turnover)] if args.turnover else [])
        for b, turnover in runs:
            r = profile_decode(engine, b, args.steps, args.device, turnover)
            b = f"{b} + a prompt every {turnover} steps" if turnover else b
            ms = {k: r["by_kind"].get(k, 0.0) * 1e3 for k in kinds}
            name = label + ("" if args.pdl else " without PDL")
            if engine.runner.calibration_source == "timed":  # in-process timing: perf.md item 6's slow mode?
                name += " (calibrated here)"
            lines.append(f"| {name} | {b} | {r['wall'] * 1e3:.2f} | {r['busy'] * 1e3:.2f} | "
                         f"{(r['wall'] - r['busy']) * 1e3:.2f} | {r['host_waits'] * 1e3:.2f} | {r['launches']:.0f} | "
                         f"{(r['wall'] - r['busy']) * 1e6 / max(r['launches'], 1):.2f} | {floor * 1e3:.2f} | "
                         f"{'-' if r['sm_mhz'] is None else format(r['sm_mhz'], ',.0f')} | "
                         + " | ".join(f"{ms[k]:.2f}" for k in kinds) + " |")
            print(lines[-1], flush=True)
            top = sorted(r["by_name"].items(), key=lambda kv: -kv[1])[:12]
            tops.append(f"\n{label} B={b}, longest kernels (ms per step, kind):")
            tops += [f"  {sec * 1e3:7.3f}  {kind_of(name):15s} {name[:110]}" for name, sec in top]
        if args.prefill:
            r = profile_prefill(engine, args.prefill, args.device)
            prefill_lines.append(f"| {label} | {args.prefill} x {PROMPT} | {r['first_queued'] * 1e3:.2f} | "
                                 f"{r['queued'] * 1e3:.2f} | {r['wall'] * 1e3:.2f} | {r['busy'] * 1e3:.2f} | "
                                 f"{r['launches']} |")
            print(prefill_lines[-1], flush=True)
            prefill_hosts.append(f"\n{label} prefill step, host operators by their own time (ms, profiled run):")
            prefill_hosts += [f"  {sec * 1e3:8.3f}  {name[:110]}" for name, sec in r["host_top"]]
        del engine
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if prefill_lines:  # queued near wall with kernels well under it: the host bounds the step
        prefill_lines = ["", "one prefill step with nothing decoding (eager): host ms until queued (the first step of "
                         "its size; the best of the next two), until the GPU finished, kernels (profiled run)", "",
                         "| engine | prompts | first queued ms | queued ms | wall ms | kernels ms | kernels |",
                         "|---|---|---:|---:|---:|---:|---:|"] + prefill_lines + prefill_hosts
    text = "\n".join(["decode step profile, per step (kernels by kind in ms)", ""] + lines + tops + prefill_lines)
    print("\n" + text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "step_profile.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
