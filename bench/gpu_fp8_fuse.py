"""The FP8 producers' e4m3 handoff on the device (`fp8.FUSE_QUANT`, `quantize.FUSED_PRODUCERS`; #20).

    PYTHONPATH=. python3 bench/gpu_fp8_fuse.py --out DIR [--batches 1,8,64,256] [--engines ...]
    PYTHONPATH=. python3 bench/gpu_fp8_fuse.py --out DIR --device cpu   # CPU try-out at toy size

1. The fused producers alone at 1/16/64/256 rows, in CUDA graphs: add + RMSNorm + quantize against
   `add_rms_norm` + the one-pass quantizer, SiLU * mul + quantize against `silu_mul` + the quantizer.
2. Engine decode tok/s (graphs, overlap, PDL; 128 + 128 tokens) at --batches: bf16; fp8 (FP8
   head) without the handoff; fp8-fuse as shipped (FUSE_QUANT, FUSED_PRODUCERS: the norms, and SiLU * mul
   into the split-K kernel's block form, `fp8.BLOCK_FORM`); and fp8-fuse-norms (the norms only, one scale a
   row: as shipped before session 26). Session 14 measured fp8 / all fused (SiLU's scale per row then)
   at B=64 14,821 / 15,148 and B=256 31,960 / 31,583 (the fused SiLU was the slower kernel).
Tables printed last and written to DIR/fp8_fuse.md. `--device cpu` runs part 2 on the tiny shape
(no graphs), to try the script before a device call. Session 14 also removed what this script
first measured (G31): folding the split-K sum into each tile's last program (correct, slower).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_shape_model import make_shape_model  # noqa: E402

from onebit.kernels import fp8, triton_fp8_fast, triton_fp8_fused, triton_fused  # noqa: E402
from onebit.kernels.timing import graph_us  # noqa: E402
from onebit.models import quantize as model_quantize  # noqa: E402

DEVICE = "cuda"


def fused_table() -> list[str]:
    """Part 1: the fused producers against the unfused kernel + the one-pass quantizer."""
    lines = ["| producer | rows | unfused + quantizer us | fused us | fused speed-up |", "|---|---:|---:|---:|---:|"]
    for rows in (1, 16, 64, 256):
        gate_up = torch.randn(rows, 2 * 12288, device="cuda", dtype=torch.bfloat16)
        unfused = graph_us(lambda: triton_fp8_fast.quantize_rows(triton_fused.silu_mul(gate_up)))
        # the fused SiLU emits a scale per row and block; it replaces SiLU + the per-row quantizer
        fused = graph_us(lambda: triton_fp8_fused.silu_mul_quantize(gate_up, fp8.ACTIVATION_BLOCK))
        lines.append(f"| SiLU * mul | {rows} | {unfused:.1f} | {fused:.1f} | {unfused / fused:.2f}x |")
        x, res = (torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
        unfused = graph_us(lambda: triton_fp8_fast.quantize_rows(triton_fused.add_rms_norm(x, res, w, 1e-6)[0]))
        fused = graph_us(lambda: triton_fp8_fused.add_rms_norm_quantize(x, res, w, 1e-6))
        lines.append(f"| add + RMSNorm | {rows} | {unfused:.1f} | {fused:.1f} | {unfused / fused:.2f}x |")
    return lines


# name -> (quantize, FUSE_QUANT, FUSED_PRODUCERS, fp8.BLOCK_FORM). The fused SiLU emits a scale per row
# and block, which only the block form takes; "fp8-fuse-norms" is what shipped before session 26.
ENGINES = {"bf16": (None, False, model_quantize.FUSED_PRODUCERS, fp8.BLOCK_FORM),
           "fp8": ("fp8", False, model_quantize.FUSED_PRODUCERS, fp8.BLOCK_FORM),
           "fp8-fuse": ("fp8", True, model_quantize.FUSED_PRODUCERS, fp8.BLOCK_FORM),
           "fp8-fuse-norms": ("fp8", True, ("norm",), False)}


def engine_table(batches: list[int], names: list[str]) -> list[str]:
    """Part 2: decode tok/s per engine setting and batch size."""
    from onebit.bench.offline import engine_speed_row
    from onebit.engine.build import build_engine
    from onebit.engine.config import EngineConfig

    shape = make_shape_model(Path(tempfile.mkdtemp()) / "shape", "qwen3-8b" if DEVICE == "cuda" else "qwen3-tiny")
    shipped = fp8.FUSE_QUANT, model_quantize.FUSED_PRODUCERS, fp8.BLOCK_FORM
    lines = ["| engine | " + " | ".join(f"B={b}" for b in batches) + " | build s |",
             "|---|" + "---:|" * (len(batches) + 1)]
    for name in names:
        quantize, fuse, producers, block_form = ENGINES[name]
        fp8.FUSE_QUANT, model_quantize.FUSED_PRODUCERS, fp8.BLOCK_FORM = fuse, producers, block_form
        fp8.reset()
        config = EngineConfig(
            model=str(shape), device=DEVICE, dtype="bfloat16" if DEVICE == "cuda" else "float32",
            parallel=max(batches), ctx_size=128 + 128 + 16, max_batch_tokens=8192, enable_prefix_caching=False,
            load_format="dummy", cuda_graphs=DEVICE == "cuda", overlap=DEVICE == "cuda", quantize=quantize,
            quantize_lm_head=quantize is not None)
        lines.append(engine_speed_row(name, lambda config=config: build_engine(config), batches, 128, 128))
    fp8.FUSE_QUANT, model_quantize.FUSED_PRODUCERS, fp8.BLOCK_FORM = shipped
    return lines


def main() -> int:
    """Both parts; tables printed last."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/fp8_fuse"))
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda; cpu to try the script at toy size")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    lines = [f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU (toy shapes)'}  torch {torch.__version__}", ""]
    if DEVICE == "cuda":
        try:
            lines += fused_table() + [""]
        except Exception:
            traceback.print_exc()
            lines += ["fused_table FAILED (traceback above)", ""]
        (args.out / "fp8_fuse.md").write_text("\n".join(lines) + "\n")
    if not args.skip_engines:
        lines += engine_table([int(b) for b in args.batches.split(",")], args.engines.split(","))
    text = "\n".join(lines)
    (args.out / "fp8_fuse.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
