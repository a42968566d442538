"""FP8 checkpoints and the FP8 KV cache on the device, Qwen3-8B shape, random weights.

    PYTHONPATH=. python3 bench/gpu_fp8_more.py [--out DIR] [--kv-memory-gib 12]

Four engines over the same random weights (the dummy loader's, seed 0):
- bf16: the reference; decode tok/s at every batch size, KV blocks in the budget;
- bf16 weights + `--kv-cache-dtype fp8`: decode at 64 and 256, KV blocks in the same budget;
- `--quantize fp8` (per-output-channel scales, quantized at load);
- a block-scaled FP8 checkpoint (weight_scale_inv per 128x128 block, as Qwen3-8B-FP8 is published),
  written from the bf16 engine's weights, then loaded through the normal loader (load time stated).
Logits of one 64-token prompt (prefill) against the bf16 engine's: relative error and top-1 agreement.
Decode: 128 random prompt tokens, 128 new, `onebit.bench.offline.run_batch`. Table printed last.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import hf_state_dict, make_shape_model, save_sharded  # noqa: E402

PROMPT, NEW = 128, 128
BLOCK = (128, 128)


def block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale_inv per 128x128 block, the last ones partial) on w's device."""
    n, k = w.shape
    rows, cols = -(-n // BLOCK[0]), -(-k // BLOCK[1])
    padded = torch.zeros(rows * BLOCK[0], cols * BLOCK[1], device=w.device)
    padded[:n, :k] = w.float()
    blocks = padded.view(rows, BLOCK[0], cols, BLOCK[1])
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).view(rows * BLOCK[0], cols * BLOCK[1])[:n, :k]
    return q.to(torch.float8_e4m3fn), scale


def write_block_checkpoint(model, shape_dir: Path, out: Path) -> float:
    """Write `model`'s weights as a block-scaled FP8 checkpoint into `out`; returns seconds."""
    import json
    import shutil

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for f in shape_dir.iterdir():
        shutil.copy(f, out / f.name)
    tensors = {}
    for name, t in hf_state_dict(model).items():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            tensors[name], tensors[name[:-len("weight")] + "weight_scale_inv"] = block_quantize(t)
        else:
            tensors[name] = t
    save_sharded(tensors, out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(BLOCK)}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return time.perf_counter() - start


@torch.inference_mode()
def prompt_logits(engine, ids: list[int]) -> torch.Tensor:
    """Logits at every prompt position through the engine's packing and KV cache."""
    from onebit.engine.sampling_params import SamplingParams
    from onebit.engine.sequence import Sequence

    seq = Sequence("probe", ids, SamplingParams(), engine.ctx_size, 0)
    engine.scheduler.blocks.grow(seq, len(ids))
    try:
        input_ids, positions, meta = engine.runner.prepare([(seq, len(ids))])
        hidden = engine.runner.model(input_ids, positions, engine.runner.kv_cache, meta, engine.runner.rope)
        return engine.runner.model.compute_logits(hidden).float()
    finally:
        engine.scheduler.blocks.free_sequence(seq)


def main() -> None:
    """Build each engine in turn, measure, print the table last."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--kv-memory-gib", type=float, default=12.0, help="KV budget of every engine")
    ap.add_argument("--shape", default="qwen3-8b", help="qwen3-tiny tries the script on a CPU")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-batch", type=int, default=256, help="skip larger batch sizes (quick CPU tries)")
    args = ap.parse_args()
    from onebit.bench.offline import random_prompts, run_batch
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig

    work = Path(tempfile.mkdtemp())
    shape = make_shape_model(work / "shape", args.shape)
    cuda = args.device.startswith("cuda")
    rows, reference = [], None
    notes = [f"{torch.cuda.get_device_name() if cuda else 'CPU'}  torch {torch.__version__}"]

    def engine_for(model: Path, **options):
        start = time.perf_counter()
        engine = build_engine(EngineConfig(
            model=str(model), device=args.device, dtype="bfloat16", parallel=256, ctx_size=PROMPT + NEW + 16,
            max_batch_tokens=8192, enable_prefix_caching=False, kv_cache_memory=int(args.kv_memory_gib * 2**30),
            **options))
        if cuda:
            torch.cuda.synchronize()
        return engine, time.perf_counter() - start

    def measure(label: str, engine, built_s: float, batches: list[int]) -> None:
        nonlocal reference
        probe = random_prompts(1, 64, engine.model_config.vocab_size, seed=7)[0]
        logits = prompt_logits(engine, probe)
        if reference is None:
            reference = logits
            err, top1 = 0.0, 1.0
        else:
            err = ((logits - reference).norm() / reference.norm()).item()
            top1 = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
        run_batch(engine, 4, PROMPT, 8, seed=999)  # warm-up
        speeds = {}
        for b in [b for b in batches if b <= args.max_batch]:
            speeds[b] = run_batch(engine, b, PROMPT, NEW, seed=b).decode_tokens_per_s
            print(f"{label} B={b}: {speeds[b]:,.0f} tok/s", flush=True)
        rows.append((label, engine.scheduler.blocks.num_blocks, built_s, err, top1, speeds))

    def release(engine) -> None:
        del engine
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()

    engine, built = engine_for(shape, load_format="dummy")
    measure("bf16", engine, built, [1, 8, 64, 256])
    ckpt = work / "fp8-block"
    notes.append(f"block-scaled FP8 checkpoint written in {write_block_checkpoint(engine.runner.model, shape, ckpt):.1f}s")
    release(engine)

    engine, built = engine_for(shape, load_format="dummy", kv_cache_dtype="fp8")
    measure("bf16 + fp8 KV", engine, built, [64, 256])
    release(engine)

    engine, built = engine_for(shape, load_format="dummy", quantize="fp8")
    measure("--quantize fp8 (per channel)", engine, built, [1, 8, 64])
    release(engine)

    engine, built = engine_for(ckpt)
    measure("FP8 checkpoint (128x128 blocks)", engine, built, [1, 8, 64])
    release(engine)

    batches = [1, 8, 64, 256]
    lines = notes + ["", f"{args.shape} shape, random weights, {PROMPT} prompt + {NEW} new tokens; decode tok/s. "
                     f"KV blocks in {args.kv_memory_gib:g} GiB; logits of a 64-token prompt vs bf16.", "",
                     "| engine | " + " | ".join(f"B={b}" for b in batches) + " | KV blocks | build s | "
                     "logits rel. err | top-1 agree |",
                     "|---|" + "---:|" * (len(batches) + 4)]
    for label, blocks, built, err, top1, speeds in rows:
        cells = " | ".join(f"{speeds[b]:,.0f}" if b in speeds else "-" for b in batches)
        lines.append(f"| {label} | {cells} | {blocks:,} | {built:.0f} | {err:.2e} | {100 * top1:.1f}% |")
    text = "\n".join(lines)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8_more.md").write_text(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
