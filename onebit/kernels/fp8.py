"""FP8 (e4m3) weights: per-output-channel quantization and the products that read them.

A weight [N, K] is stored as e4m3 values with one float32 scale per output row, so
`weight ~= q * scale[:, None]`. Two ways to multiply by it:
- weight-only (few rows, decoding): a Triton kernel loads the e4m3 weight (half the bytes of
  bf16), widens it in registers and multiplies with the activations as they are; the scale is
  applied to each output column once. `triton_fp8_fast.split_k` splits K over several programs
  so the 4096-wide products keep enough loads in flight; `triton_fp8.weight_only` is the first
  kernel (one program per column tile), kept as a candidate. Block-scaled checkpoints (one
  scale per 128 x 128 block, as published) go through the same two kernels, each block column's
  partial sum scaled as it is made; `calibrate_blocks` picks between them per shape.
- w8a8 (many rows): both operands in FP8 on the tensor cores. The activations are quantized per
  token (one scale per row, as vLLM's dynamic per-token scheme) by one Triton kernel
  (`triton_fp8_fast.quantize_rows`) and `torch._scaled_mm` multiplies with row-wise scales, or
  (24-128 rows, where it won on the H200) the split-K kernel's e4m3 tensor-core tiles do. The
  split-K kernel may instead take one scale per row and block of ACTIVATION_BLOCK values
  ("split_k_w8a8_blocks", `triton_fp8_fast.quantize_row_blocks`): a quantizer of one program per block
  in place of one that walks each row twice.
Which one runs for a (shape, row count) is measured at start-up (`calibrate`, inside CUDA graphs
like the decode steps), never assumed; unmeasured cases take a fixed rule (`default_choice`).
A product whose input comes from an RMSNorm or SiLU * mul may take it already quantized
(`Fp8Rows`, from `add_rms_norm_quantize` with a scale per row / `silu_mul_quantize` with a scale per
row and block: the producer's kernel emits e4m3 and the scales, so no separate quantizer runs) where
its kind takes e4m3 rows in that form (`FED_KINDS`); its calibration then times those kinds without
the quantizer.
On the CPU (and wherever neither applies) the plain-torch references below run; tests compare
the kernels against them.
"""

from __future__ import annotations

import bisect
import logging
from typing import NamedTuple

import torch

from onebit.kernels import fused_ref
from onebit.kernels.timing import ProductTimer, candidate_agrees

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# Measured on the H200 (docs/perf-history.md, FP8): at 64 rows the first weight-only kernel beat
# `_scaled_mm` with per-token quantization by torch ops on the attention products (25.6 vs 36.2 us,
# 18.7 vs 35.9) and tied on the MLP's down product; at 128 rows it lost everywhere. The rule for
# uncalibrated cases and for block-scaled checkpoints.
MAX_WEIGHT_ONLY_ROWS = 64
MAX_CALIBRATED_ROWS = 256
# False: the first dispatch (v0.8: `triton_fp8.weight_only` up to 64 rows, `_scaled_mm` after
# quantizing by torch ops above), for A/B runs (bench/gpu_fp8_fast.py).
FAST = True
# `torch._scaled_mm(use_fast_accum=...)`. True (since the first FP8 dispatch): on Hopper the FP8
# tensor cores accumulate each K slice in a reduced-precision accumulator (about 14 significant
# bits after aligning to the largest product, per DeepSeek-V3's report) and cuBLAS/CUTLASS never
# promote the running sum to float32; False promotes it every few K steps (slower, float32-exact
# up to the e4m3 inputs). bench/gpu_fp8_fast.py measures both, speed and error.
FAST_ACCUM = True
# Let an RMSNorm / SiLU * mul feeding an FP8 product emit its e4m3 rows (see `takes_quantized_rows`).
# Session 9 timed it with `_scaled_mm` only (nothing gained: at 8-64 rows the weight-only kernels
# ran, which take no e4m3 rows). Since session 12's w8a8 split-K won 24-128 rows, whose separate
# quantizer is 0.46 ms of a 4.87 ms fp8 B=64 step (session 13), the producers feed that kernel too.
# Session 14 (G31) with the norms and SiLU * mul fused (a scale per row then): fp8 B=64 +2.2%, B=256
# -1.2%; now only the norms fuse by default (`models.quantize.FUSED_PRODUCERS`). Session 15 (G33 part
# C, bench/gpu_fp8_fuse.py): norms only, fp8 B=1/8/64/256 354 / 2,032 / 15,214 / 32,510 against 355 /
# 2,031 / 14,926 / 32,401 unfused, so on.
FUSE_QUANT = True
# On the CPU, run the products the GPU sends to `_scaled_mm` without calibration (more than
# MAX_WEIGHT_ONLY_ROWS rows: prefills) through `w8a8_ref`, activations quantized per token, as on the
# GPU; False keeps the weight-only reference everywhere. For accuracy runs (bench/perplexity.py).
CPU_EMULATES_GPU = False

# One row through a split-K config without a split (session 27's narrow configs): the MLP's gate_up
# product applies SiLU * mul itself (`linear_silu_mul`) and the SiLU kernel's 36 launches a step go.
# On since session 28 (H200, 8B shape, FP8 B=1): 389.5 -> 390.9 alone, 393.7 -> 398.6 with `pdl.EARLY_WEIGHTS`.
SILU_IN_GATE_UP = True

# The `run_kernel` kinds that quantize the activations per token (their reference is `w8a8_ref`).
W8A8_KINDS = ("scaled_mm", "scaled_mm_torch", "split_k_w8a8")
# The kind that quantizes them per row and block of ACTIVATION_BLOCK values (reference `w8a8_blocks_ref`).
# Session 25's step profile: at 64 rows the per-row quantizer in front of o and down took 0.27 ms of a
# 4.47 ms FP8 step (72 launches of 3.7 us, each program walking a 4,096- or 12,288-value row twice).
# With BLOCK_FORM the calibration times it beside "split_k_w8a8" (same configs) and takes it only where
# it is faster. Session 26 on the H200 (8B shape, start-up calibration lines): o at 32 rows 10.2 -> 9.4
# us (64 rows even, 10.6 / 10.7), down 21.8 -> 18.4 (32) and 23.3 -> 20.9 (64) quantizing its own input,
# 16.7 / 18.3 fed by the fused SiLU (quantize.FUSED_PRODUCERS); FP8 B=64 +4.4%, B=32 +2.9% over three
# runs a side. Not timed for a product a norm feeds one scale a row (qkv, gate_up): the fed per-row kind
# beat it there (qkv 9.7 vs 11.6 us, gate_up 30.8 vs 32.1 at 64 rows), and each config adds to the start-up.
BLOCK_W8A8_KIND = "split_k_w8a8_blocks"
BLOCK_FORM = True
ACTIVATION_BLOCK = 512  # a multiple of every w8a8 config's BLOCK_K, so no K tile spans two blocks

# The kinds that take e4m3 rows from a fusing producer (`Fp8Rows`) instead of quantizing their own, by
# the form the producer emits: "rows" (one scale a row: the norms) or "blocks" (one scale a row and
# block of ACTIVATION_BLOCK values: SiLU * mul).
FED_KINDS = {"rows": ("scaled_mm", "split_k_w8a8"), "blocks": (BLOCK_W8A8_KIND,)}

try:
    from onebit.kernels import triton_fp8, triton_fp8_fast, triton_fp8_fused
except ImportError:  # pragma: no cover - depends on the install
    triton_fp8 = triton_fp8_fast = triton_fp8_fused = None

# (N, K, has bias) -> [(rows, (kind, config))] sorted by rows: the winner measured at each row
# count; a product of m rows takes the entry of the fewest calibrated rows >= m.
_CHOSEN: dict[tuple[int, int, bool], list[tuple[int, tuple[str, tuple | None]]]] = {}
# The same for products whose input arrives already quantized (`Fp8Rows`) where their kind takes it:
# (N, K, has bias, the form the producer emits: "rows" or "blocks") -> [(rows, (kind, config))].
_CHOSEN_QUANTIZED_INPUT: dict[tuple[int, int, bool, str], list[tuple[int, tuple[str, tuple | None]]]] = {}
# Block-scaled weights (published FP8 checkpoints): (N, K, block, has bias) -> [(rows, (kind, config))].
_CHOSEN_BLOCKS: dict[tuple[int, int, tuple[int, int], bool], list[tuple[int, tuple[str, tuple | None]]]] = {}


class Fp8Rows(NamedTuple):
    """Activations already quantized for an FP8 product: q [T, K] e4m3 and float32 scales, per token
    (block 0: scale [T, 1], x ~= q * scale) or per token and block of `block` values of K (scale
    [T, ceil(K / block)]); dtype is the one x had (the product's output dtype)."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype
    block: int = 0

    @property
    def form(self) -> str:
        """"rows" or "blocks", as `FED_KINDS` names the forms."""
        return "blocks" if self.block else "rows"

    def values(self) -> torch.Tensor:
        """The values the rows stand for, in float32."""
        if self.block:
            return dequantize_row_blocks(self.q, self.scale, self.block)
        return dequantize_rows(self.q, self.scale.view(-1))

    @property
    def shape(self) -> torch.Size:
        """The activations' shape, [T, K]."""
        return self.q.shape

    @property
    def device(self) -> torch.device:
        """Where the activations are."""
        return self.q.device


def _ieee_scale(amax: torch.Tensor) -> torch.Tensor:
    # amax / FP8_MAX rounded as IEEE division, as the Triton quantizers divide (`div_rn`). Dividing a
    # CUDA tensor by a Python number multiplies by its reciprocal instead, one ulp off for some amax.
    return amax / amax.new_tensor(FP8_MAX)


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q [R, K] in e4m3 and scale [R] float32 such that t ~= q * scale[:, None]."""
    amax = t.abs().amax(dim=-1).float().clamp_min(1e-12)
    scale = _ieee_scale(amax)
    q = (t.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def quantize_row_blocks(t: torch.Tensor, block: int = ACTIVATION_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q [R, K] in e4m3 and scale [R, ceil(K / block)] float32 such that each block of
    `block` values of a row is ~= its q times its scale (`quantize_rows` on each block)."""
    rows, k = t.shape
    blocks = torch.nn.functional.pad(t.float(), (0, -k % block)).view(rows, -1, block)
    scale = _ieee_scale(blocks.abs().amax(dim=-1).clamp_min(1e-12))
    q = (blocks / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(rows, -1)[:, :k].contiguous()
    return q, scale


def dequantize_row_blocks(q: torch.Tensor, scale: torch.Tensor, block: int = ACTIVATION_BLOCK) -> torch.Tensor:
    """The values `quantize_row_blocks` gave q and scale for, in float32."""
    return q.float() * scale.repeat_interleave(block, dim=1)[:, :q.shape[1]]


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q * scale[:, None] in `dtype`."""
    return (q.float() * scale[:, None]).to(dtype)


def weight_only_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                    bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the few-row product: x @ (q * scale).T + bias, accumulated in float32."""
    y = (x.float() @ q.float().t()) * scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the many-row product: x quantized per token to e4m3, then the scaled product."""
    xq, xs = quantize_rows(x)
    y = (xq.float() @ q.float().t()) * xs[:, None] * scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def w8a8_blocks_ref(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of "split_k_w8a8_blocks": x quantized per row and block (`quantize_row_blocks`), then the
    scaled product."""
    y = (dequantize_row_blocks(*quantize_row_blocks(x)) @ q.float().t()) * scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def quantized_input_ref(x: Fp8Rows, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the product of rows already quantized: x.values() @ (q * scale).T + bias."""
    if x.block:
        y = (x.values() @ q.float().t()) * scale[None, :]
    else:  # the scale after the product, as w8a8_ref (equal to it bit for bit)
        y = (x.q.float() @ q.float().t()) * x.scale.view(-1, 1) * scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def add_rms_norm_quantize_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q, scale [T, 1], x + residual or None): the RMSNorm's result in x's dtype, quantized per token."""
    if residual is None:
        normed, summed = fused_ref.rms_norm_ref(x, weight, eps), None
    else:
        normed, summed = fused_ref.add_rms_norm_ref(x, residual, weight, eps)
    q, s = quantize_rows(normed)
    return q, s.view(-1, 1), summed


def silu_mul_quantize_ref(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale [T, ceil(I / ACTIVATION_BLOCK)]): silu(gate) * up in gate_up's dtype, quantized per
    token and block of ACTIVATION_BLOCK values."""
    return quantize_row_blocks(fused_ref.silu_mul_ref(gate_up), ACTIVATION_BLOCK)


def add_rms_norm_quantize(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                          eps: float) -> tuple[Fp8Rows, torch.Tensor | None]:
    """(rms_norm(x + residual) as `Fp8Rows`, x + residual or None): one Triton kernel on CUDA."""
    if x.is_cuda and triton_fp8_fused is not None and x.dim() == 2 and x.is_contiguous():
        q, s, summed = triton_fp8_fused.add_rms_norm_quantize(x, residual, weight, eps)
    else:
        q, s, summed = add_rms_norm_quantize_ref(x, residual, weight, eps)
    return Fp8Rows(q, s, x.dtype), summed


def silu_mul_quantize(gate_up: torch.Tensor) -> Fp8Rows:
    """silu(gate) * up for gate_up = [gate | up], as `Fp8Rows` with a scale per row and block of
    ACTIVATION_BLOCK values: one Triton kernel on CUDA."""
    if gate_up.is_cuda and triton_fp8_fused is not None and gate_up.dim() == 2 and gate_up.is_contiguous():
        q, s = triton_fp8_fused.silu_mul_quantize(gate_up, ACTIVATION_BLOCK)
    else:
        q, s = silu_mul_quantize_ref(gate_up)
    return Fp8Rows(q, s, gate_up.dtype, ACTIVATION_BLOCK)


def scaled_mm_quantized(x: Fp8Rows, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Rows already in e4m3 times the FP8 weight on the tensor cores (row-wise scales, a bf16
    result, accumulation as FAST_ACCUM says)."""
    y = torch._scaled_mm(x.q, q.t(), scale_a=x.scale.view(-1, 1), scale_b=scale.view(1, -1),
                         bias=bias.to(torch.bfloat16) if bias is not None else None,
                         out_dtype=torch.bfloat16, use_fast_accum=FAST_ACCUM)
    return y.to(x.dtype)


def _scaled_mm(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
               fused: bool = False) -> torch.Tensor:
    """The many-row product on FP8 tensor cores (row-wise scales give a bf16 result); `fused`
    quantizes the activations with the one-pass Triton kernel instead of torch ops."""
    xq, xs = triton_fp8_fast.quantize_rows(x) if fused else quantize_rows(x)
    return scaled_mm_quantized(Fp8Rows(xq, xs, x.dtype), q, scale, bias)


def _quantized_on_gpu(x: torch.Tensor, form: str) -> Fp8Rows:
    """x quantized by a Triton kernel in `form`: "rows" (one scale a row, the one-pass quantizer) or
    "blocks" (one a row and block of ACTIVATION_BLOCK values)."""
    if form == "blocks":
        return Fp8Rows(*triton_fp8_fast.quantize_row_blocks(x, ACTIVATION_BLOCK), x.dtype, ACTIVATION_BLOCK)
    return Fp8Rows(*triton_fp8_fast.quantize_rows(x), x.dtype)


def split_k_w8a8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                 config: tuple) -> torch.Tensor:
    """The activations quantized per token by the one-pass kernel, then the Triton split-K product
    with e4m3 tensor-core tiles (w8a8, the same numbers as `_scaled_mm`'s)."""
    return split_k_w8a8_quantized(_quantized_on_gpu(x, "rows"), q, scale, bias, config)


def split_k_w8a8_blocks(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                        config: tuple) -> torch.Tensor:
    """The activations quantized per row and block of ACTIVATION_BLOCK values, then the Triton split-K
    product with e4m3 tensor-core tiles, each K tile's sum times its block's scale."""
    return split_k_w8a8_quantized(_quantized_on_gpu(x, "blocks"), q, scale, bias, config)


def split_k_w8a8_quantized(x: Fp8Rows, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                           config: tuple) -> torch.Tensor:
    """Rows already in e4m3 (their producer quantized them) through the w8a8 split-K product, with the
    scales per row or per row and block as the rows have them."""
    return triton_fp8_fast.split_k(x.q, q, scale, bias, config, x_scale=x.scale if x.block else x.scale.view(-1),
                                   out_dtype=x.dtype, x_block=x.block)


def run_quantized(kind: str, config: tuple | None, x: Fp8Rows, q: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """One of `FED_KINDS` on rows already in e4m3, of the form that kind takes (ValueError otherwise)."""
    if kind not in FED_KINDS[x.form]:
        raise ValueError(f"{kind} does not take e4m3 rows with {x.form} scales")
    if kind in ("split_k_w8a8", BLOCK_W8A8_KIND):
        return split_k_w8a8_quantized(x, q, scale, bias, config)
    return scaled_mm_quantized(x, q, scale, bias)


def run_kernel(kind: str, config: tuple | None, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    """One of the CUDA products by name: "split_k" and "weight_only" (Triton, weight-only, with a
    config of their module), "split_k_w8a8" (Triton, e4m3 rows), "split_k_w8a8_blocks" (the same,
    a scale per row and block of K), "scaled_mm" (fused quantization) or "scaled_mm_torch" (torch ops)."""
    if kind == "split_k":
        return triton_fp8_fast.split_k(x, q, scale, bias, config)
    if kind == "split_k_w8a8":
        return split_k_w8a8(x, q, scale, bias, config)
    if kind == BLOCK_W8A8_KIND:
        return split_k_w8a8_blocks(x, q, scale, bias, config)
    if kind == "weight_only":
        return triton_fp8.weight_only(x, q, scale, bias, config)
    return _scaled_mm(x, q, scale, bias, fused=kind == "scaled_mm")


def default_choice(rows: int, n: int, k: int) -> tuple[str, tuple | None]:
    """(kind, config) for a product nothing was calibrated for: the split-K kernel up to 16 rows,
    the first weight-only kernel up to MAX_WEIGHT_ONLY_ROWS, then `_scaled_mm` (shapes it takes)."""
    if rows <= 16:
        return "split_k", triton_fp8_fast.default_config(rows)
    if rows <= MAX_WEIGHT_ONLY_ROWS:
        return "weight_only", triton_fp8.MANY_ROWS_CONFIG
    if n % 16 == 0 and k % 16 == 0:
        return "scaled_mm", None
    if rows <= triton_fp8_fast.MAX_ROWS:
        return "split_k", triton_fp8_fast.default_config(rows)
    return "ref", None


def choice_for(rows: int, n: int, k: int, has_bias: bool, fed: str = "") -> tuple[str, tuple | None]:
    """The calibrated (kind, config) for this product, else `default_choice`; `fed` ("rows" or
    "blocks"): the table of a product whose producer hands over e4m3 rows of that form where the
    chosen kind takes them."""
    table = (_CHOSEN_QUANTIZED_INPUT.get((n, k, has_bias, fed)) if fed else _CHOSEN.get((n, k, has_bias)))
    if table:
        at = bisect.bisect_left(table, rows, key=lambda entry: entry[0])
        if at < len(table):
            return table[at][1]
    return default_choice(rows, n, k)


def takes_quantized_rows(rows: int, n: int, k: int, has_bias: bool, device: torch.device, fed: str = "rows") -> bool:
    """Whether a product fed by a fusing producer of e4m3 rows in form `fed` (an RMSNorm: "rows", SiLU *
    mul: "blocks") runs a kind that takes them (`FED_KINDS`) for this many rows, so the producer should
    emit `Fp8Rows` rather than values in the model's dtype."""
    if not FUSE_QUANT:
        return False
    if device.type == "cuda":
        return (FAST and triton_fp8_fused is not None
                and choice_for(rows, n, k, has_bias, fed)[0] in FED_KINDS[fed])
    return CPU_EMULATES_GPU and fed == "rows" and default_choice(rows, n, k)[0] == "scaled_mm"


def candidates(rows: int, n: int, k: int) -> list[tuple[str, tuple | None]]:
    """The (kind, config) pairs `calibrate` times for a product of this many rows."""
    out = [("split_k", c) for c in triton_fp8_fast.candidates(rows)]
    if rows <= triton_fp8.MAX_ROWS:
        out.append(("weight_only", triton_fp8.DEFAULT_CONFIG if rows <= 16 else triton_fp8.MANY_ROWS_CONFIG))
    if rows >= 16 and n % 16 == 0 and k % 16 == 0:
        out.append(("scaled_mm", None))
    out += [("split_k_w8a8", c) for c in triton_fp8_fast.w8a8_candidates(rows)]
    if BLOCK_FORM:
        out += [(BLOCK_W8A8_KIND, c) for c in triton_fp8_fast.w8a8_candidates(rows) if ACTIVATION_BLOCK % c[2] == 0]
    return out


def _references(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                with_blocks: bool, rows_per_chunk_elements: int = 1 << 25
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(weight_only_ref, w8a8_ref, w8a8_blocks_ref or None without `with_blocks`) of x in float32, the
    weight widened a slice of rows at a time (at most 128 MB of float32 at once, not a float32 copy of
    the whole matrix)."""
    xq, xs = quantize_rows(x)
    x32, xq32 = x.float(), xq.float()
    xb32 = dequantize_row_blocks(*quantize_row_blocks(x)) if with_blocks else None
    exact, both, blocks = [], [], []
    step = max(1, rows_per_chunk_elements // q.shape[1])
    for start in range(0, q.shape[0], step):
        w = q[start:start + step].float().t()
        s = scale[start:start + step][None, :]
        b = bias[start:start + step].float()[None, :] if bias is not None else 0.0
        exact.append(x32 @ w * s + b)
        both.append(xq32 @ w * xs[:, None] * s + b)
        if with_blocks:
            blocks.append(xb32 @ w * s + b)
    return torch.cat(exact, dim=1), torch.cat(both, dim=1), torch.cat(blocks, dim=1) if with_blocks else None


@torch.inference_mode()
def calibrate(layers: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], rows: list[int],
              dtype: torch.dtype = torch.bfloat16, fed: dict[str, str] | None = None) -> list[str]:
    """Time every candidate (`run_kernel` kinds and configs) per distinct CUDA FP8 weight shape
    among `layers` (name -> (q, scale, bias)) and per row count in `rows` (up to
    MAX_CALIBRATED_ROWS), inside CUDA graphs over weights that do not stay in L2; check each
    result against its reference on the spot and remember the fastest correct one. The layers
    named in `fed` get e4m3 rows of its form ("rows", "blocks") from their producer where the chosen
    kind takes them (with FUSE_QUANT): those kinds are timed on rows quantized beforehand, into a
    table of their own. Returns one report line per shape and row count."""
    if triton_fp8_fast is None or not FAST:
        return []
    fed = fed or {}
    lines, seen = [], set()
    for name, (q, scale, bias) in layers.items():
        form = fed.get(name, "") if FUSE_QUANT else ""
        shape = (q.shape[0], q.shape[1], bias is not None)
        if (shape, form) in seen or not q.is_cuda:
            continue
        seen.add((shape, form))
        n, k = q.shape
        table, timer = [], ProductTimer(q, scale)
        for m in sorted(r for r in set(rows) if r <= MAX_CALIBRATED_ROWS):
            x = torch.randn(m, k, device=q.device, dtype=dtype)
            kinds = [(kind, c) for kind, c in candidates(m, n, k) if not (form == "rows" and kind == BLOCK_W8A8_KIND)]
            exact, both, blocks = _references(x, q, scale, bias, any(kind == BLOCK_W8A8_KIND for kind, _ in kinds))
            rows_in = _quantized_on_gpu(x, form) if form else None
            timed = {}
            for kind, config in kinds:
                want = both if kind in W8A8_KINDS else blocks if kind == BLOCK_W8A8_KIND else exact
                if not candidate_agrees(lambda: run_kernel(kind, config, x, q, scale, bias), want,
                                        f"fp8 {kind} {config}", name, log):
                    continue
                if form and kind in FED_KINDS[form]:  # the producer quantizes: only the product is timed
                    timed[(kind, config)] = timer.us(
                        lambda w, s, kind=kind, config=config: run_quantized(kind, config, rows_in, w, s, bias))
                else:
                    timed[(kind, config)] = timer.us(
                        lambda w, s, kind=kind, config=config: run_kernel(kind, config, x, w, s, bias))
            if not timed:
                continue
            best = min(timed, key=timed.get)
            table.append((m, best))
            best_of_kind: dict[str, tuple[float, tuple | None]] = {}
            for (kd, c), us in timed.items():
                if kd not in best_of_kind or us < best_of_kind[kd][0]:
                    best_of_kind[kd] = (us, c)
            others = "; ".join(f"{kd} {us:.1f}{f' {c}' if c else ''}" for kd, (us, c) in best_of_kind.items())
            lines.append(f"fp8 {name} {n}x{k}{f' (e4m3 {form} input)' if form else ''}, {m} row(s): {best[0]} {best[1] or ''} "
                         f"{timed[best]:.1f} us ({n * k / timed[best] / 1e6:.2f} TB/s); best of each kind, us: {others}")
        if form:
            _CHOSEN_QUANTIZED_INPUT[(*shape, form)] = table
        else:
            _CHOSEN[shape] = table
        timer.close()  # the copies' memory back to the device before the graphs are captured
    return lines


def picks() -> dict[str, dict[int, str]]:
    """The calibrated choices, for reports: {"NxK" (with "e4m3 rows " or "e4m3 blocks " before it for a
    fused producer's table): {rows: "kind config"}}."""
    tables = [("", n, k, table) for (n, k, _), table in _CHOSEN.items()]
    tables += [(f"e4m3 {form} ", n, k, table) for (n, k, _, form), table in _CHOSEN_QUANTIZED_INPUT.items()]
    return {f"{label}{n}x{k}": {rows: f"{kind} {config}" for rows, (kind, config) in table}
            for label, n, k, table in tables}


def _config_state(config: tuple | None) -> list | None:
    return None if config is None else [_config_state(c) if isinstance(c, tuple) else c for c in config]


def _config_from_state(config: list | None) -> tuple | None:
    return None if config is None else tuple(_config_from_state(c) if isinstance(c, list) else c for c in config)


def chosen_state() -> dict[str, list]:
    """Every calibrated choice (the three tables) as JSON-ready lists (`onebit.engine.calibration_cache`)."""
    return {name: [[_config_state(key), [[rows, kind, _config_state(config)] for rows, (kind, config) in table]]
                   for key, table in tables.items()]
            for name, tables in (("plain", _CHOSEN), ("quantized_input", _CHOSEN_QUANTIZED_INPUT),
                                 ("blocks", _CHOSEN_BLOCKS))}


def restore_chosen(state: dict[str, list]) -> None:
    """Make `chosen_state`'s choices the calibrated ones, as if the calibrations had just found them."""
    reset()
    for name, tables in (("plain", _CHOSEN), ("quantized_input", _CHOSEN_QUANTIZED_INPUT), ("blocks", _CHOSEN_BLOCKS)):
        for key, table in state.get(name, []):
            tables[_config_from_state(key)] = [(rows, (kind, _config_from_state(config))) for rows, kind, config in table]


def reset() -> None:
    """Forget every calibrated choice (tests, A/B runs)."""
    _CHOSEN.clear()
    _CHOSEN_QUANTIZED_INPUT.clear()
    _CHOSEN_BLOCKS.clear()


def dequantize_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A block-scaled weight as values: q [N, K] times scale_inv [ceil(N/bn), ceil(K/bk)] of its block."""
    bn, bk = block
    n, k = q.shape
    if n % bn == 0 and k % bk == 0:  # whole blocks: broadcast the scales, no per-element copy
        blocks = q.view(n // bn, bn, k // bk, bk).float() * scale_inv.float()[:, None, :, None]
        return blocks.view(n, k).to(dtype)
    per_element = scale_inv.float().repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (q.float() * per_element).to(dtype)


def block_weight_only_ref(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                          bias: torch.Tensor | None) -> torch.Tensor:
    """Reference of the block-scaled product: x @ dequantize_blocks(q, scale_inv).T + bias, in float32."""
    y = x.float() @ dequantize_blocks(q, scale_inv, block).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def linear_blocks(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] times a block-scaled FP8 weight (as published FP8 checkpoints store it) plus bias.

    On CUDA up to MAX_WEIGHT_ONLY_ROWS rows: a Triton weight-only kernel applying each (block row,
    block column) scale to its partial product (exact: no requantization), the one
    `calibrate_blocks` measured fastest for the shape and row count (else the first weight-only
    kernel). More rows: the weight dequantized to x's dtype for one cuBLAS product (a transient copy
    of one matrix). Elsewhere the reference."""
    if x.is_cuda and x.dim() == 2:
        if x.shape[0] <= MAX_WEIGHT_ONLY_ROWS and triton_fp8 is not None:
            kind, config = block_choice_for(x.shape[0], q.shape[0], q.shape[1], block, bias is not None)
            return run_block_kernel(kind, config, x.contiguous(), q, scale_inv, block, bias)
        weight = dequantize_blocks(q, scale_inv, block, x.dtype)
        return torch.nn.functional.linear(x, weight, bias.to(x.dtype) if bias is not None else None)
    return block_weight_only_ref(x, q, scale_inv, block, bias)


def run_block_kernel(kind: str, config: tuple | None, x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor,
                     block: tuple[int, int], bias: torch.Tensor | None) -> torch.Tensor:
    """A block-scaled product by kernel: "split_k" (`triton_fp8_fast`) or "weight_only" (`triton_fp8`)."""
    if kind == "split_k":
        return triton_fp8_fast.split_k(x, q, scale_inv, bias, config, block=block)
    return triton_fp8.weight_only(x, q, scale_inv, bias, config, block=block)


def block_candidates(rows: int, block: tuple[int, int]) -> list[tuple[str, tuple | None]]:
    """The (kind, config) pairs `calibrate_blocks` times: the first weight-only kernel, and the
    split-K configs for the row count whose K tile fits the block (tensor-core tiles shrunk to one
    block column where they span more)."""
    out: list[tuple[str, tuple | None]] = [("weight_only", None)]
    if triton_fp8_fast is None:
        return out
    bk = block[1]
    for bm, bn, tile_k, split, warps in triton_fp8_fast.candidates(rows):
        if bm > 1 and tile_k > bk:
            tile_k = bk
        if bk % tile_k == 0 or (bm == 1 and tile_k % bk == 0):
            config = (bm, bn, tile_k, split, warps)
            if ("split_k", config) not in out:
                out.append(("split_k", config))
    return out


def block_choice_for(rows: int, n: int, k: int, block: tuple[int, int], has_bias: bool) -> tuple[str, tuple | None]:
    """The calibrated (kind, config) of a block-scaled product, else the first weight-only kernel."""
    table = _CHOSEN_BLOCKS.get((n, k, tuple(block), has_bias))
    if table:
        at = bisect.bisect_left(table, rows, key=lambda entry: entry[0])
        if at < len(table):
            return table[at][1]
    return ("weight_only", None)


def calibrate_blocks(layers: dict[str, tuple[torch.Tensor, torch.Tensor, tuple[int, int], torch.Tensor | None]],
                     rows: list[int], dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """`calibrate` for block-scaled weights: per distinct CUDA shape among `layers` (name -> (q,
    scale_inv, block, bias)) and per row count in `rows` up to MAX_WEIGHT_ONLY_ROWS, time each
    `block_candidates` pair inside CUDA graphs over weights that do not stay in L2, check it against
    `block_weight_only_ref` and remember the fastest correct one. Returns one line per shape and
    row count."""
    if triton_fp8_fast is None or triton_fp8 is None:
        return []
    lines, seen = [], set()
    for name, (q, scale_inv, block, bias) in layers.items():
        key = (q.shape[0], q.shape[1], tuple(block), bias is not None)
        if key in seen or not q.is_cuda:
            continue
        seen.add(key)
        n, k = q.shape
        table, timer = [], ProductTimer(q, scale_inv)
        for m in sorted(r for r in set(rows) if r <= MAX_WEIGHT_ONLY_ROWS):
            x = torch.randn(m, k, device=q.device, dtype=dtype)
            want = block_weight_only_ref(x, q, scale_inv, block, bias)
            timed = {}
            for kind, config in block_candidates(m, block):
                if not candidate_agrees(lambda: run_block_kernel(kind, config, x, q, scale_inv, block, bias), want,
                                        f"fp8 block {kind} {config}", name, log):
                    continue
                timed[(kind, config)] = timer.us(
                    lambda w, s, kind=kind, config=config: run_block_kernel(kind, config, x, w, s, block, bias))
            if not timed:
                continue
            best = min(timed, key=timed.get)
            table.append((m, best))
            first = timed.get(("weight_only", None))
            lines.append(f"fp8 block {name} {n}x{k} {block}, {m} row(s): {best[0]} {best[1] or ''} "
                         f"{timed[best]:.1f} us ({n * k / timed[best] / 1e6:.2f} TB/s); first weight-only kernel "
                         f"{f'{first:.1f} us' if first is not None else '-'}")
        _CHOSEN_BLOCKS[key] = table
        timer.close()  # the copies' memory back to the device before the graphs are captured
    return lines


def linear_silu_mul(x: torch.Tensor | Fp8Rows, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                    fed: str = "") -> torch.Tensor | None:
    """silu(gate) * up of `linear(x, q, scale, bias, fed)` for an MLP's [gate | up] weight in one kernel,
    bit for bit the product followed by `ops.silu_mul`, where that applies (`SILU_IN_GATE_UP`, one row in
    the model's dtype on CUDA, whose calibrated kind is the one-row split-K kernel without a split); else
    None, and the caller runs the two."""
    if not (isinstance(x, torch.Tensor) and x.is_cuda and x.dim() == 2 and triton_fp8_fast is not None):
        return None
    config = silu_mul_config(x.shape[0], q.shape[0], q.shape[1], bias is not None, fed)
    return triton_fp8_fast.split_k_silu_mul(x.contiguous(), q, scale, bias, config) if config else None


def silu_mul_config(rows: int, n: int, k: int, has_bias: bool, fed: str = "") -> tuple | None:
    """The config `linear_silu_mul` runs a [gate | up] product of this shape and row count with (its
    calibrated one-row split-K config without a split, while `SILU_IN_GATE_UP`), else None."""
    if not (SILU_IN_GATE_UP and FAST and rows == 1 and n % 2 == 0):
        return None
    kind, config = choice_for(rows, n, k, has_bias, fed if FUSE_QUANT else "")
    return config if kind == "split_k" and config[0] == 1 and config[3] == 1 else None


def linear(x: torch.Tensor | Fp8Rows, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
           fed: str = "") -> torch.Tensor:
    """x [T, K] times an FP8 weight (q [N, K], scale [N]) plus bias: the kernels on CUDA (the
    calibrated choice for the row count), else the weight-only reference (`w8a8_ref` for the
    products `CPU_EMULATES_GPU` names). x may be `Fp8Rows` (its producer quantized it, as
    `takes_quantized_rows` asked: then the chosen kind, one of `FED_KINDS` for its form); `fed` names
    the form the product's producer emits ("rows", "blocks"; which calibration table applies)."""
    if isinstance(x, Fp8Rows):
        if x.q.is_cuda:
            kind, config = choice_for(x.q.shape[0], q.shape[0], q.shape[1], bias is not None, x.form)
            if kind in FED_KINDS[x.form]:
                return run_quantized(kind, config, x, q, scale, bias)
            if x.form == "rows":  # not asked for (an uncalibrated count): the many-row product takes them
                return scaled_mm_quantized(x, q, scale, bias)
            return linear(x.values().to(x.dtype), q, scale, bias)
        return quantized_input_ref(x, q, scale, bias)
    if x.is_cuda and x.dim() == 2 and triton_fp8 is not None:
        m, (n, k) = x.shape[0], q.shape
        if not FAST:  # the first dispatch, for A/B runs
            kind, config = ("weight_only", None) if m <= MAX_WEIGHT_ONLY_ROWS else \
                ("scaled_mm_torch", None) if n % 16 == 0 and k % 16 == 0 else ("ref", None)
        else:
            kind, config = choice_for(m, n, k, bias is not None, fed if FUSE_QUANT else "")
        if kind != "ref":
            return run_kernel(kind, config, x.contiguous(), q, scale, bias)
    if CPU_EMULATES_GPU and not x.is_cuda and x.dim() == 2 and default_choice(x.shape[0], *q.shape)[0] == "scaled_mm":
        return w8a8_ref(x, q, scale, bias)
    return weight_only_ref(x, q, scale, bias)
