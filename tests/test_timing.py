"""The CUDA-graph timing helper's logic (onebit.kernels.timing) with a fake clock: medians per
call, the single-call fallback, how many weight copies defeat the L2 cache, and the rotation."""

from __future__ import annotations

import torch

from onebit.kernels import timing


class FakeClock:
    """Stands in for `timing.CudaGraphs`: capture calls fn `reps` times (as a real capture runs
    the Python once) and returns a replay that calls it `reps` times again; each timed run
    reports the next of `ms`."""

    def __init__(self, ms: list[float], capturable: bool = True):
        self.ms = iter(ms)
        self.capturable = capturable
        self.captures = 0

    def synchronize(self) -> None:
        pass

    def capture(self, fn, reps):
        if not self.capturable:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        for _ in range(reps):
            fn()

        def replay():
            for _ in range(reps):
                fn()
        return replay

    def elapsed_ms(self, run) -> float:
        run()
        return next(self.ms)


def test_graph_us_is_the_median_replay_divided_by_the_calls_in_it():
    calls = []
    ms = [2.0, 0.2, 0.4, 0.6, 99.0]  # per call: 100, 10, 20, 30, 4950 us
    us = timing.graph_us(lambda: calls.append(1), replays=5, clock=FakeClock(ms))
    assert us == 0.6 * 1000 / timing.REPS_PER_REPLAY
    # one warm-up call, the captured calls, then every replay's calls
    assert len(calls) == 1 + timing.REPS_PER_REPLAY + 5 * timing.REPS_PER_REPLAY


def test_graph_us_times_single_calls_when_capture_fails():
    calls = []
    clock = FakeClock([0.03, 0.01, 0.02], capturable=False)
    assert timing.graph_us(lambda: calls.append(1), replays=3, clock=clock) == 20.0
    assert len(calls) == 1 + 3 and clock.captures == 0


def test_copies_needed_reads_past_l2_within_free_memory():
    mb = 1 << 20
    free = 100 << 30
    assert timing.copies_needed(32 * mb, free) == 4  # 4 x 32 MB = 128 MB
    assert timing.copies_needed(50 * mb, free) == 3
    assert timing.copies_needed(1200 * mb, free) == 2  # never fewer than two
    assert timing.copies_needed(1000, free) == timing.MAX_COPIES
    assert timing.copies_needed(32 * mb, 3 * 32 * mb + timing.COPY_HEADROOM_BYTES) == 4  # the extra 3 fit
    assert timing.copies_needed(32 * mb, 3 * 32 * mb + timing.COPY_HEADROOM_BYTES - 1) == 1


def test_weight_copies_are_equal_and_separate():
    w, s = torch.randn(8, 16), torch.rand(8)
    copies = timing.weight_copies(w, s, min_bytes=3 * (w.numel() + s.numel()) * 4, free=1 << 40)
    assert len(copies) == 3 and copies[0][0] is w and copies[0][1] is s
    for cw, cs in copies[1:]:
        assert torch.equal(cw, w) and torch.equal(cs, s)
        assert cw.data_ptr() != w.data_ptr() and cs.data_ptr() != s.data_ptr()


def test_product_timer_runs_each_call_on_the_next_copy():
    w = torch.randn(4, 4)
    seen = []
    clock = FakeClock([0.1] * 7)
    with timing.ProductTimer(w, clock=clock, free=1 << 40) as timer:
        pointers = [c[0].data_ptr() for c in timer.copies]
        assert len(pointers) == timing.MAX_COPIES == len(set(pointers))
        us = timer.us(lambda weight: seen.append(weight.data_ptr()))
    assert us == 0.1 * 1000 / timing.REPS_PER_REPLAY
    assert seen[:2 * len(pointers)] == pointers + pointers  # cycles through every copy in order
    assert len(seen) == 1 + timing.REPS_PER_REPLAY + 7 * timing.REPS_PER_REPLAY
    assert timer.copies == []  # freed on exit
