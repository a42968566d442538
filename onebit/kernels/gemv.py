"""Few-row linear layers: cuBLAS or a Triton kernel, whichever measured faster for the shape.

`calibrate(layers, rows)` times `F.linear` against each Triton candidate (`triton_gemv`) for
every weight shape and each row count in `rows` (inside a CUDA graph, as decode steps run them), checks the Triton result against `F.linear`
on the spot, and keeps a candidate only where it is correct and faster. `linear()` then
dispatches CUDA inputs of a calibrated (shape, rows) to the winner and everything else to
`F.linear`. Nothing is chosen where nothing was measured, so CPU runs always take `F.linear`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from onebit.kernels import batch_invariant
from onebit.kernels.timing import graph_us

log = logging.getLogger(__name__)

try:
    from onebit.kernels import triton_gemv
except ImportError:  # pragma: no cover - depends on the install
    triton_gemv = None

# The most rows a Triton candidate takes; calibrating more is pointless.
MAX_CALIBRATED_ROWS = triton_gemv.MAX_ROWS if triton_gemv is not None else 0

# (rows, N, K, dtype, has bias) -> (kernel name, config); cases where cuBLAS won are absent.
_CHOSEN: dict[tuple[int, int, int, torch.dtype, bool], tuple[str, tuple[int, int, int]]] = {}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through a Triton kernel when x is a CUDA input of a (shape, rows) it won; in
    deterministic mode (`batch_invariant.mode`) through the batch-invariant product."""
    if batch_invariant.enabled():
        return batch_invariant.linear(x, weight, bias)
    if _CHOSEN and x.is_cuda and x.dim() == 2 and x.is_contiguous() and weight.stride(1) == 1:
        chosen = _CHOSEN.get((x.shape[0], weight.shape[0], weight.shape[1], weight.dtype, bias is not None))
        if chosen is not None:
            return triton_gemv.KERNELS[chosen[0]](x, weight, bias, chosen[1])
    return F.linear(x, weight, bias)


def _best(x, weight, bias, name: str):
    """(microseconds, kernel, config) of the fastest correct candidate, or None."""
    want = F.linear(x, weight, bias).float()
    best = None
    for kernel, config in triton_gemv.candidates(x.shape[0]):
        run = triton_gemv.KERNELS[kernel]
        try:
            got = run(x, weight, bias, config).float()
        except Exception as error:  # a config this device cannot compile is just not a candidate
            log.debug("%s %s failed for %s: %s", kernel, config, name, error)
            continue
        if ((got - want).norm() / want.norm().clamp_min(1e-6)).item() > 1e-2:
            log.warning("%s %s gave wrong results for %s; not used", kernel, config, name)
            continue
        us = graph_us(lambda: run(x, weight, bias, config))
        if best is None or us < best[0]:
            best = (us, kernel, config)
    return best


@torch.inference_mode()
def calibrate(layers: dict[str, tuple[torch.Tensor, torch.Tensor | None]], rows: list[int]) -> list[str]:
    """Measure, per distinct CUDA weight shape among `layers` (name -> (weight, bias)) and per row
    count in `rows`, cuBLAS against the Triton candidates; remember the winners. Returns one
    report line per shape and row count."""
    if triton_gemv is None:
        return ["few-row linear: Triton is not installed, cuBLAS everywhere"]
    lines, seen = [], set()
    for name, (weight, bias) in layers.items():
        shape = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
        if shape in seen or not weight.is_cuda:
            continue
        seen.add(shape)
        kbytes = weight.numel() * weight.element_size() / 1e3  # kB per microsecond is GB/s
        for m in rows:
            x = torch.randn(m, weight.shape[1], device=weight.device, dtype=weight.dtype)
            torch_us = graph_us(lambda: F.linear(x, weight, bias))
            best = _best(x, weight, bias, name)
            if best is not None and best[0] < torch_us:
                _CHOSEN[(m, *shape)] = best[1:]
            verdict = f"Triton {best[1]} {best[2]} {best[0]:.1f} us ({kbytes / best[0]:,.0f} GB/s)" if best \
                else "no Triton candidate ran"
            lines.append(f"linear {name} {weight.shape[0]}x{weight.shape[1]}, {m} row(s): cuBLAS {torch_us:.1f} us "
                         f"({kbytes / torch_us:,.0f} GB/s), {verdict} -> "
                         f"{'Triton' if (m, *shape) in _CHOSEN else 'cuBLAS'}")
    return lines


def reset() -> None:
    """Forget every choice (tests)."""
    _CHOSEN.clear()
