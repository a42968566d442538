"""Timing a GPU operation the way a decode step runs it: replayed inside a CUDA graph.

A single call timed with events includes its launch gap (several microseconds), which for a
10-50 us product is most of the difference between two kernels; inside a graph, as in the
engine's decode steps, consecutive kernels start back to back. Measured on the H200: cuBLAS bf16
products of the 8B shape at 1 row read 3.2-4.2 TB/s in a graph, 0.8-3.0 TB/s timed one call at a time.
"""

from __future__ import annotations

import torch

REPS_PER_REPLAY = 20


def graph_us(fn, replays: int = 15) -> float:
    """Median microseconds of one call of `fn` (CUDA work only), from replays of a CUDA graph of
    REPS_PER_REPLAY calls; falls back to timing single calls if `fn` cannot be captured."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(REPS_PER_REPLAY):
                fn()
        run, per_run = graph.replay, REPS_PER_REPLAY
    except RuntimeError:
        torch.cuda.synchronize()
        run, per_run = fn, 1
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / per_run)
    times.sort()
    return times[len(times) // 2]
