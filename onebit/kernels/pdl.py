"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (Hopper and later).

A decode step is a chain of several hundred short kernels, replayed from a CUDA graph; between
two of them the GPU idles while the next one is launched and its programs are set up (G23,
session 10: 0.4-0.5 ms of a 3.3-5.7 ms step with 300+ kernels). With PDL a kernel may be launched
while the one before it still runs: its programs start, wait at `griddepcontrol.wait` until the
previous kernel has finished and its writes are visible, and only then touch memory. So each
kernel here calls `wait_for_previous` first thing: nothing moves before the predecessor is done
(no read of its output, no write over its input), and only the launch and set-up overlap. The
same call lets the next kernel launch early (`griddepcontrol.launch_dependents`). The one exception
is `EARLY_WEIGHTS` (on): one-row products read their first weight tile, and the norms their weight,
before the wait, as nothing a step runs writes a weight.

`enabled` is read at each launch (and so when CUDA graphs are captured). On since session 11's
G25 (bench/gpu_pdl.py, H200, 8B shape): bf16 +2.6% at B=1, fp8 +5.9% at B=1, within 1% either
way at B=8 and 64, the same greedy tokens in all six. A launch asks for it only where `usable()`
(a compiled Triton with the instructions, an sm_90+ device). Kernels launched without PDL, or
torch's and cuBLAS's, wait for their predecessors as usual, and the wait instruction is harmless
there.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

enabled = True  # the wish; a launch uses PDL only where `usable()` too
# One-row products (FP8 split-K, bf16 gemv, packed GGUF mode "h2") load their first weight tile, and the
# add + RMSNorm kernels their weight, before `wait_for_previous`: weights are never written by a step's
# kernels, so that load overlaps the previous kernel's tail, which a one-row product's single pass
# otherwise waits out. On since session 28 (H200, 8B shape, B=1): FP8 389.5 -> 393.7, bf16 227.1 -> 231.6,
# Q4_K_M packed 315.1 -> 321.6.
EARLY_WEIGHTS = True


@triton.jit
def wait_for_previous(PDL: tl.constexpr):
    """With PDL: wait until the previous kernel has finished, then let the next one launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def options() -> dict:
    """Keyword arguments for a launch of a kernel that calls `wait_for_previous(PDL)`: PDL where
    `enabled` and `usable()`, nothing otherwise."""
    return {"PDL": True, "launch_pdl": True} if enabled and usable() else {}


def early_weights() -> bool:
    """Whether a one-row product launched now loads its first weight tile before waiting for the
    previous kernel (`EARLY_WEIGHTS`, with PDL in use)."""
    return EARLY_WEIGHTS and enabled and usable()


_usable: bool | None = None  # usable()'s answer, found at the first launch (an eager step has hundreds)


def usable() -> bool:
    """Whether launches in this process can use PDL: a compiled (not interpreted) Triton with the
    instructions, on a CUDA device of compute capability 9.0 or later (Hopper); decided once, for
    the device current at the first launch (a worker process serves one device)."""
    global _usable
    if _usable is None:
        _usable = (os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available() and supported()
                   and torch.cuda.get_device_capability(torch.cuda.current_device()) >= (9, 0))
    return _usable


def supported() -> bool:
    """Whether this Triton has the grid-dependency instructions (PDL itself needs sm_90 or later)."""
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True
