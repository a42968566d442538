"""Few-row linear layers: cuBLAS or a Triton kernel, whichever measured faster for the shape.

`calibrate(layers, rows)` times `F.linear` against each Triton candidate (`triton_gemv`) for
every weight shape and each row count in `rows`, inside CUDA graphs over copies of the weight
that do not fit in L2 (`timing.ProductTimer`), as decode steps run them; it checks each Triton
result against `F.linear` on the spot and keeps a candidate only where it is correct and faster.
`linear()` then dispatches inputs of a calibrated (device type, shape, rows) to the winner and
everything else to `F.linear`. Nothing is chosen where nothing was measured, so CPU runs always
take `F.linear`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from onebit.kernels import batch_invariant
from onebit.kernels.timing import ProductTimer, candidate_agrees

log = logging.getLogger(__name__)

try:
    from onebit.kernels import triton_gemv
except ImportError:  # pragma: no cover - depends on the install
    triton_gemv = None

# The most rows a Triton candidate takes; calibrating more is pointless.
MAX_CALIBRATED_ROWS = triton_gemv.MAX_SPLIT_K_ROWS if triton_gemv is not None else 0

# (device type, rows, N, K, dtype, has bias) -> (kernel name, config); cases where cuBLAS won are absent.
_CHOSEN: dict[tuple[str, int, int, int, torch.dtype, bool], tuple[str, tuple[int, int, int]]] = {}


def choice_for(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[str, tuple] | None:
    """The (Triton kernel, config) calibrated for this product, or None for `F.linear`."""
    return _CHOSEN.get((x.device.type, x.shape[0], weight.shape[0], weight.shape[1], weight.dtype, bias is not None))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through a Triton kernel when x is an input of a (device, shape, rows) it won; in
    deterministic mode (`batch_invariant.mode`) through the batch-invariant product."""
    if batch_invariant.enabled():
        return batch_invariant.linear(x, weight, bias)
    if _CHOSEN and x.dim() == 2 and x.is_contiguous() and weight.stride(1) == 1:
        chosen = choice_for(x, weight, bias)
        if chosen is not None:
            return triton_gemv.KERNELS[chosen[0]](x, weight, bias, chosen[1])
    return F.linear(x, weight, bias)


def _correct_candidates(x, weight, bias, name: str) -> list[tuple[str, tuple[int, int, int]]]:
    """The Triton (kernel, config) pairs for x's row count that compile and match F.linear."""
    want = F.linear(x, weight, bias).float()
    out = []
    for kernel, config in triton_gemv.candidates(x.shape[0]):
        if candidate_agrees(lambda: triton_gemv.KERNELS[kernel](x, weight, bias, config), want,
                            f"{kernel} {config}", name, log):
            out.append((kernel, config))
    return out


def _label(kernel: str, config: tuple[int, int, int]) -> str:
    return f"{kernel} {'/'.join(map(str, config))}"


@torch.inference_mode()
def calibrate(layers: dict[str, tuple[torch.Tensor, torch.Tensor | None]], rows: list[int],
              timer=ProductTimer, device_types: tuple[str, ...] = ("cuda",)) -> list[str]:
    """Measure, per distinct weight shape among `layers` (name -> (weight, bias)) on a device of
    `device_types` and per row count in `rows`, cuBLAS against the Triton candidates; remember the
    winners. Returns one line per shape and row count (microseconds and TB/s of the weight bytes
    for cuBLAS and every correct candidate) and one summary line per shape, starting "few-row
    choice" (the row counts where Triton won; cuBLAS's and the best Triton TB/s per row count). `timer(weight)` gives the
    context manager that times (`ProductTimer`; a fake in unit tests, which also pass
    device_types ("cpu",) to run the kernels in Triton's interpreter).

    Cost at start-up, Qwen3-8B (5 shapes, 1.6 GB of bf16 weights), `--parallel 64` (rows 1, 2, 4,
    8, 12, 16, then 24-64 in steps of 8): 15 timings at 1 row (cuBLAS, 6 GEMV, 5 skinny and 3
    split-K configs), 9 at each other count to 16, 7 at each count above (cuBLAS + 6 split-K),
    102 per shape; each timing is 1 warm-up call + 7 replays x 20 calls, so about 102 x 141 =
    14,400 reads of each weight, 23 TB in all: ~8 s at 3 TB/s, plus the Triton compiles
    (cached on disk after the first start). Up to 128 rows with a larger `--parallel`."""
    if triton_gemv is None:
        return ["few-row linear: Triton is not installed, cuBLAS everywhere"]
    lines, seen = [], set()
    for name, (weight, bias) in layers.items():
        shape = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
        if shape in seen or weight.device.type not in device_types:
            continue
        seen.add(shape)
        n, k = weight.shape
        mbytes = weight.numel() * weight.element_size() / 1e6  # MB per microsecond is TB/s
        triton_rows, speeds = [], []
        with timer(weight) as clock:
            for m in rows:
                x = torch.randn(m, k, device=weight.device, dtype=weight.dtype)
                cublas_us = clock.us(lambda w: F.linear(x, w, bias))
                triton_us = {}
                for kernel, config in _correct_candidates(x, weight, bias, name):
                    run = triton_gemv.KERNELS[kernel]
                    triton_us[(kernel, config)] = clock.us(lambda w, run=run, config=config: run(x, w, bias, config))
                best = min(triton_us, key=triton_us.get, default=None)
                key = (weight.device.type, m, *shape)
                if best is not None and triton_us[best] < cublas_us:
                    _CHOSEN[key] = best
                    triton_rows.append(m)
                else:
                    _CHOSEN.pop(key, None)
                speeds.append(f"{m} {mbytes / cublas_us:.2f}/{f'{mbytes / triton_us[best]:.2f}' if best else '-'}")
                each = ", ".join(f"{_label(*c)} {mbytes / us:.2f}" for c, us in triton_us.items()) or "none ran"
                verdict = f"{_label(*best)} {triton_us[best]:.1f} us" if key in _CHOSEN else "cuBLAS"
                lines.append(f"linear {name} {n}x{k}, {m} row(s): cuBLAS {cublas_us:.1f} us "
                             f"{mbytes / cublas_us:.2f} TB/s; Triton TB/s: {each} -> {verdict}")
        won = ",".join(map(str, triton_rows)) or "none"
        lines.append(f"few-row choice {name} {n}x{k}: Triton at rows {won} of {','.join(map(str, rows))}; "
                     f"TB/s cuBLAS/best Triton by rows: {', '.join(speeds)}")
    return lines


def picks() -> dict[str, dict[int, str]]:
    """The calibrated Triton choices, for reports: {"NxK": {rows: "kernel config"}} (cuBLAS elsewhere)."""
    out: dict[str, dict[int, str]] = {}
    for (_, rows, n, k, _, _), (kernel, config) in sorted(_CHOSEN.items(), key=lambda item: item[0][1]):
        out.setdefault(f"{n}x{k}", {})[rows] = f"{kernel} {config}"
    return out


def reset() -> None:
    """Forget every choice (tests)."""
    _CHOSEN.clear()
