"""Timing a GPU operation the way a decode step runs it: replayed inside a CUDA graph.

A single call timed with events includes its launch gap (several microseconds), which for a
10-50 us product is most of the difference between two kernels; inside a graph, as in the
engine's decode steps, consecutive kernels start back to back. Measured on the H200: cuBLAS bf16
products of the 8B shape at 1 row read 3.2-4.2 TB/s in a graph, 0.8-3.0 TB/s timed one call at a time.

A decode step reads each layer's weight once, from device memory; a graph of 20 calls on one
32 MB weight would read it from the 50 MB L2 cache instead. `ProductTimer` therefore runs each
call of a replay on the next of several copies of the weight (`weight_copies`, `rotated`). The
start-up calibrations (`gemv.calibrate`, `fp8.calibrate`) and the device benchmarks time through it.
"""

from __future__ import annotations

import itertools
import logging
from typing import Callable

import torch

def candidate_agrees(run: Callable[[], torch.Tensor], want: torch.Tensor, what: str, name: str,
                     log: logging.Logger) -> bool:
    """Whether a calibration candidate runs and agrees with `want` (relative error at most 1e-2),
    so that it may be timed. A config this device cannot compile is logged (debug) and left out;
    one that gives wrong results is logged (warning) and left out. `what` names the candidate,
    `name` the layer, `log` the calibrating module's logger."""
    try:
        got = run().float()
    except Exception as error:  # a config this device cannot compile is just not a candidate
        log.debug("%s failed for %s: %s", what, name, error)
        return False
    if ((got - want).norm() / want.norm().clamp_min(1e-6)).item() > 1e-2:
        log.warning("%s gave wrong results for %s; not used", what, name)
        return False
    return True


REPS_PER_REPLAY = 20
# What the copies of one weight add up to at least: more than the H200's 50 MB L2 holds.
L2_DEFEAT_BYTES = 128 << 20
MAX_COPIES = 8
# Device memory left free after the copies; fewer than that and only the original is timed.
COPY_HEADROOM_BYTES = 1 << 30


class CudaGraphs:
    """The real clock of `graph_us`: captures into a CUDA graph and times with CUDA events."""

    @staticmethod
    def synchronize() -> None:
        """Wait for the device."""
        torch.cuda.synchronize()

    @staticmethod
    def capture(fn, reps: int):
        """A no-argument callable replaying a graph of `reps` calls of `fn`; raises RuntimeError
        where `fn` cannot be captured."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        return graph.replay

    @staticmethod
    def elapsed_ms(run) -> float:
        """Milliseconds of device time one call of `run` takes."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def graph_us(fn, replays: int = 15, clock=CudaGraphs) -> float:
    """Median microseconds of one call of `fn` (CUDA work only), from replays of a CUDA graph of
    REPS_PER_REPLAY calls; falls back to timing single calls if `fn` cannot be captured. `clock`
    is `CudaGraphs` except in unit tests."""
    fn()  # compiles and warms up outside the capture
    clock.synchronize()
    try:
        run, per_run = clock.capture(fn, REPS_PER_REPLAY), REPS_PER_REPLAY
    except RuntimeError:
        clock.synchronize()
        run, per_run = fn, 1
    times = sorted(clock.elapsed_ms(run) * 1000 / per_run for _ in range(replays))
    return times[len(times) // 2]


def copies_needed(size: int, free: int, min_bytes: int = L2_DEFEAT_BYTES) -> int:
    """How many instances (the original included) of `size` bytes of weights to cycle through so
    that one cycle reads at least `min_bytes`: 2 to MAX_COPIES, or 1 where the extra copies would
    not leave COPY_HEADROOM_BYTES of the `free` device memory."""
    copies = min(MAX_COPIES, max(2, -(-min_bytes // max(size, 1))))
    return copies if free >= (copies - 1) * size + COPY_HEADROOM_BYTES else 1


def weight_copies(*tensors: torch.Tensor, min_bytes: int = L2_DEFEAT_BYTES,
                  free: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    """`tensors` and enough clones of them (`copies_needed`) that cycling through them reads more
    than the L2 cache holds; `free` defaults to the device's free memory."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    if free is None:
        free, _ = torch.cuda.mem_get_info(tensors[0].device)
    count = copies_needed(size, free, min_bytes)
    return [tensors] + [tuple(t.clone() for t in tensors) for _ in range(count - 1)]


def rotated(fn, copies: list[tuple[torch.Tensor, ...]]):
    """A no-argument callable that runs `fn(*copy)` for the next of `copies` on each call (for
    `graph_us`: the calls of one replay then read different memory)."""
    sets = itertools.cycle(copies)
    return lambda: fn(*next(sets))


class ProductTimer:
    """Times products over one weight (and its companions, e.g. FP8 scales) inside CUDA graphs,
    each call on the next copy of the weight so that no replay is served from L2.

    `us(fn)` times `fn(*weights)`, where `weights` are the tensors given here or a copy of them.
    `close()` (or leaving it as a context manager) frees the copies."""

    def __init__(self, *tensors: torch.Tensor, replays: int = 7, clock=CudaGraphs, free: int | None = None):
        self.copies = weight_copies(*tensors, free=free)
        self.replays = replays
        self.clock = clock

    def us(self, fn) -> float:
        """Median microseconds of one `fn(*weights)` call (`graph_us`)."""
        return graph_us(rotated(fn, self.copies), self.replays, self.clock)

    def close(self) -> None:
        """Free the copies (their memory back to the device, before the decode graphs are captured)."""
        on_cuda = bool(self.copies) and self.copies[0][0].is_cuda
        self.copies = []
        if on_cuda:
            torch.cuda.empty_cache()

    def __enter__(self) -> ProductTimer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
