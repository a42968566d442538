"""The Python garbage collector's pauses while a benchmark runs.

The host drives every decode step, so a collection that walks a large heap stalls the GPU for as long as
it runs. Built to test that against FP8's slow mode on the H200 (B=64 / 256 10-20% under the same tree's
other runs, in the engines that timed their products in-process, whose heap is the largest; perf.md item
6): not it (session 34: no full collection, under 1% of the timed time). Benchmarks wrap their timed
region in a `GcPauses` and report its `summary()` beside the figure, so that the collector's share of any
figure stays on record.

    with GcPauses() as pauses:
        ...timed work...
    pauses.summary()  # {"collections": [12, 1, 0], "seconds": 0.0031, "longest_s": 0.0011}
"""

from __future__ import annotations

import gc
import time


class GcPauses:
    """Counts the collections of each generation and times them, between entering and leaving."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = 0.0
        self.longest_s = 0.0
        self._started: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            pause = time.perf_counter() - self._started
            self._started = None
            self.collections[info["generation"]] += 1
            self.seconds += pause
            self.longest_s = max(self.longest_s, pause)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        """Collections by generation (0, 1, 2), their total and longest pause in seconds."""
        return {"collections": list(self.collections), "seconds": round(self.seconds, 6),
                "longest_s": round(self.longest_s, 6)}
