"""The GPU's SM clock, power draw and slowdown reasons, sampled by `nvidia-smi` while a benchmark runs.

A decode figure on an H200 moves with the clock the GPU holds while it is timed: session 30 saw SM
clocks of 1,230-1,980 MHz under the 700 W software power cap during 64-row decoding, and FP8 B=64
runs of one tree 14% apart. Benchmarks wrap their timed region in a `ClockSampler` and report its
`summary()` beside the figure, so that a difference between runs can be told from a slower clock.

    with ClockSampler() as clocks:
        ...timed work...
    clocks.summary()  # {"samples": 12, "sm_mhz_mean": 1822.5, ...} or None without nvidia-smi
"""

from __future__ import annotations

import select
import subprocess

QUERY = "clocks.sm,power.draw,clocks_throttle_reasons.active"
# The bits of nvidia-smi's "clocks throttle reasons" that mean the GPU ran slower than it was asked to;
# the others (idle, an application clock setting, a sync boost) are not a slowdown of running work.
SLOWDOWN_REASONS = {0x4: "power cap", 0x8: "hardware slowdown", 0x20: "thermal", 0x40: "hardware thermal",
                    0x80: "power brake"}


def parse_samples(text: str) -> list[tuple[float, float, int]]:
    """(SM MHz, watts, reason bits) of each line `nvidia-smi --format=csv,noheader,nounits` printed for
    QUERY; lines that do not parse (a header, "[N/A]", a line cut off when the sampler stopped) are skipped."""
    samples = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            samples.append((float(fields[0]), float(fields[1]), int(fields[2], 16)))
        except ValueError:
            continue
    return samples


def summarize(samples: list[tuple[float, float, int]]) -> dict | None:
    """Mean and least SM clock, mean and peak power, and the share of samples slowed (with the reasons
    seen); None for no samples."""
    if not samples:
        return None
    clocks, watts = [s[0] for s in samples], [s[1] for s in samples]
    slowed = [s[2] for s in samples if any(s[2] & bit for bit in SLOWDOWN_REASONS)]
    reasons = sorted({name for bits in slowed for bit, name in SLOWDOWN_REASONS.items() if bits & bit})
    return {"samples": len(samples), "sm_mhz_mean": round(sum(clocks) / len(clocks), 1), "sm_mhz_min": min(clocks),
            "power_w_mean": round(sum(watts) / len(watts), 1), "power_w_max": max(watts),
            "slowed_share": round(len(slowed) / len(samples), 3), "reasons": reasons}


def describe(summary: dict | None) -> str:
    """One short cell for a table: "1,823 MHz (min 1,230), 639 W, slowed 72% (power cap)", or "-"."""
    if not summary:
        return "-"
    text = (f"{summary['sm_mhz_mean']:,.0f} MHz (min {summary['sm_mhz_min']:,.0f}), {summary['power_w_mean']:,.0f} W, "
            f"slowed {summary['slowed_share']:.0%}")
    return text + (f" ({', '.join(summary['reasons'])})" if summary["reasons"] else "")


class ClockSampler:
    """Samples GPU `index` (nvidia-smi's numbering) every `interval_ms` while the `with` block runs;
    index None samples nothing (a benchmark run without `--gpu-clocks`). Entering waits (up to
    `first_sample_s`) for nvidia-smi's first line, so that a short block still gets a sample. Where
    nvidia-smi cannot be started (no NVIDIA driver, a CPU machine) it samples nothing and `summary()`
    is None: the benchmark still runs."""

    def __init__(self, index: int | None = 0, interval_ms: int = 100, command: str = "nvidia-smi",
                 first_sample_s: float = 5.0):
        self.args = None if index is None else [command, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                                "-i", str(index), "-lms", str(interval_ms)]
        self.first_sample_s = first_sample_s
        self.process: subprocess.Popen | None = None
        self.first_line = ""
        self.samples: list[tuple[float, float, int]] = []

    def __enter__(self) -> "ClockSampler":
        if self.args is None:
            return self
        try:
            self.process = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.process = None
            return self
        ready, _, _ = select.select([self.process.stdout], [], [], self.first_sample_s)
        if ready:
            self.first_line = self.process.stdout.readline()
        return self

    def __exit__(self, *exc) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        # Read through the text stream, not communicate(): the first line's read may have buffered more.
        with self.process.stdout:
            out = self.process.stdout.read()
        self.samples = parse_samples(self.first_line + out)

    def summary(self) -> dict | None:
        """`summarize` of what was sampled (None when nothing was)."""
        return summarize(self.samples)
