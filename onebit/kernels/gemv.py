"""One-row linear layers: cuBLAS or the Triton GEMV, whichever measured faster for the shape.

`calibrate(shapes, device, dtype)` times `F.linear` against each Triton config at one row for
every weight shape, checks the Triton result against `F.linear` on the spot, and keeps a
config only where it is correct and faster. `linear()` then dispatches one-row CUDA inputs of
a calibrated shape to the winner and everything else to `F.linear`. Nothing is chosen on a
machine where nothing was measured, so CPU runs always take `F.linear`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

try:
    from onebit.kernels import triton_gemv
except ImportError:  # pragma: no cover - depends on the install
    triton_gemv = None

# (N, K, dtype, has bias) -> the winning Triton config; shapes where cuBLAS won are absent.
_CHOSEN: dict[tuple[int, int, torch.dtype, bool], tuple[int, int, int]] = {}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the Triton GEMV when x is one CUDA row of a shape it won."""
    if x.is_cuda and x.dim() == 2 and x.shape[0] == 1 and _CHOSEN and x.is_contiguous():
        config = _CHOSEN.get((weight.shape[0], weight.shape[1], weight.dtype, bias is not None))
        if config is not None and weight.stride(1) == 1:
            return triton_gemv.gemv(x, weight, bias, config)
    return F.linear(x, weight, bias)


def _median_us(fn, reps: int = 25) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    times.sort()
    return times[len(times) // 2]


@torch.inference_mode()
def calibrate(layers: dict[str, tuple[torch.Tensor, torch.Tensor | None]]) -> list[str]:
    """Measure, per distinct weight shape among `layers` (name -> (weight, bias)), cuBLAS against
    the Triton configs at one row; remember the winners. Returns one report line per shape."""
    if triton_gemv is None:
        return ["one-row linear: Triton is not installed, cuBLAS everywhere"]
    lines, seen = [], set()
    for name, (weight, bias) in layers.items():
        key = (weight.shape[0], weight.shape[1], weight.dtype, bias is not None)
        if key in seen or not weight.is_cuda:
            continue
        seen.add(key)
        x = torch.randn(1, weight.shape[1], device=weight.device, dtype=weight.dtype)
        want = F.linear(x, weight, bias).float()
        torch_us = _median_us(lambda: F.linear(x, weight, bias))
        best = None
        for config in triton_gemv.CONFIGS:
            try:
                got = triton_gemv.gemv(x, weight, bias, config).float()
            except Exception as error:  # a config this device cannot compile is just not a candidate
                log.debug("GEMV config %s failed for %s: %s", config, name, error)
                continue
            if ((got - want).norm() / want.norm().clamp_min(1e-6)).item() > 1e-2:
                continue
            us = _median_us(lambda: triton_gemv.gemv(x, weight, bias, config))
            if best is None or us < best[0]:
                best = (us, config)
        if best is not None and best[0] < torch_us:
            _CHOSEN[key] = best[1]
        kbytes = weight.numel() * weight.element_size() / 1e3  # kB per microsecond is GB/s
        verdict = (f"Triton {best[0]:.1f} us {best[1]} ({kbytes / best[0]:,.0f} GB/s)" if best else "Triton failed")
        lines.append(f"one-row linear {name} {weight.shape[0]}x{weight.shape[1]}: cuBLAS {torch_us:.1f} us "
                     f"({kbytes / torch_us:,.0f} GB/s), {verdict} -> {'Triton' if key in _CHOSEN else 'cuBLAS'}")
    return lines


def reset() -> None:
    """Forget every choice (tests)."""
    _CHOSEN.clear()
