"""How a level is shared among client processes: how many, and which workers and requests each runs.

Every process gets an even share of the C workers (they differ by at most one) and, in open
loop, the matching share of the arrival rate (Poisson streams add up to one Poisson stream).
Request indices stay global and unique: with --requests a process runs a contiguous block of
indices sized like its share of the workers; with --duration process k of n runs k, k+n, k+2n...
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from onebit.bench.loadgen import LevelPlan

# One Python client process streams comfortably this many requests at once (see client.py).
STREAMS_PER_PROC = 16


@dataclass(frozen=True)
class Share:
    """One process's part of a level: its own plan, and the global index of its local request j."""

    plan: LevelPlan
    first: int
    stride: int

    def index(self, j: int) -> int:
        """Global index of the process's j-th request."""
        return self.first + j * self.stride

    def indices(self) -> list[int]:
        """Every global index the share will run (--requests mode only)."""
        return [self.index(j) for j in range(self.plan.requests or 0)]


def parse_client_procs(text: str) -> int | str:
    """'auto' or a positive integer, as given to --client-procs."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected 'auto' or an integer >= 1, got {text!r}")
    return int(text)


def client_procs(setting: int | str, concurrency: int, cpu_count: int | None = None) -> int:
    """Processes for one level: `setting`, or for 'auto' one per 16 streams within the CPUs; never above C."""
    if setting == "auto":
        cpus = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
        wanted = min(math.ceil(concurrency / STREAMS_PER_PROC), max(1, cpus - 2))
    else:
        wanted = int(setting)
    return max(1, min(wanted, concurrency))


def even_parts(total: int, weights: list[int]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders get the leftovers); sums to `total`."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    parts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: parts[i] - exact[i])
    for i in by_remainder[:total - sum(parts)]:
        parts[i] += 1
    return parts


def split_plan(plan: LevelPlan, procs: int) -> list[Share]:
    """The shares of `plan` over `procs` processes; processes that would get no request are left out."""
    workers = even_parts(plan.concurrency, [1] * procs)
    if plan.requests is not None:
        counts = even_parts(plan.requests, workers)
        firsts = [sum(counts[:k]) for k in range(procs)]
    else:
        counts, firsts = [None] * procs, list(range(procs))
    shares = []
    for k in range(procs):
        if counts[k] == 0 or workers[k] == 0:
            continue
        rate = None if plan.request_rate is None else plan.request_rate * workers[k] / plan.concurrency
        sub = LevelPlan(workers[k], counts[k], plan.duration_s, rate, seed=plan.seed * 1000 + k)
        shares.append(Share(sub, firsts[k], 1 if plan.requests is not None else procs))
    return shares
