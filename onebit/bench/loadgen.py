"""Drive one concurrency level: closed loop (C clients back to back) or open loop (Poisson arrivals).

`send(index)` performs one request and returns its RequestResult; the load generator only
decides when to call it, stamps each result's start relative to the level, and measures the
level's wall time from the first send to the last result.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from tqdm import tqdm

from onebit.bench.client import RequestResult

Send = Callable[[int], Awaitable[RequestResult]]

# After a connection failure a closed-loop client pauses this long, so that a dead server in
# --duration mode is not hammered with thousands of refused connections a second.
FAILURE_PAUSE_S = 0.1


@dataclass
class LevelPlan:
    """How many requests a level runs: a count, or until a deadline (then in-flight ones finish)."""

    concurrency: int
    requests: int | None = None
    duration_s: float | None = None
    request_rate: float | None = None  # requests/s; None means closed loop
    seed: int = 0

    def __post_init__(self):
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of requests and duration_s")


def _stamp(result: RequestResult, sent_at: float, level_start: float) -> RequestResult:
    result.start = sent_at - level_start
    return result


async def _closed_loop(send: Send, plan: LevelPlan, start: float, bar: tqdm) -> list[RequestResult]:
    counter = itertools.count()
    results: list[RequestResult] = []
    deadline = start + plan.duration_s if plan.duration_s is not None else None

    async def client() -> None:
        while True:
            if deadline is not None and time.perf_counter() >= deadline:
                return
            index = next(counter)
            if plan.requests is not None and index >= plan.requests:
                return
            sent_at = time.perf_counter()
            result = _stamp(await send(index), sent_at, start)
            results.append(result)
            bar.update(1)
            if result.failure in ("connection", "timeout"):
                await asyncio.sleep(FAILURE_PAUSE_S)

    await asyncio.gather(*(client() for _ in range(plan.concurrency)))
    return results


async def _open_loop(send: Send, plan: LevelPlan, start: float, bar: tqdm) -> list[RequestResult]:
    rng = random.Random(plan.seed)
    gate = asyncio.Semaphore(plan.concurrency)
    results: list[RequestResult] = []

    async def one(index: int) -> None:
        async with gate:
            sent_at = time.perf_counter()
            results.append(_stamp(await send(index), sent_at, start))
            bar.update(1)

    tasks = []
    arrival = start
    for index in itertools.count():
        if plan.requests is not None and index >= plan.requests:
            break
        arrival += rng.expovariate(plan.request_rate)
        if plan.duration_s is not None and arrival - start >= plan.duration_s:
            break
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        tasks.append(asyncio.create_task(one(index)))
    await asyncio.gather(*tasks)
    return results


async def run_level(send: Send, plan: LevelPlan, show_progress: bool = True) -> tuple[list[RequestResult], float]:
    """Run one level; return its results (sorted by index) and its wall time in seconds.

    With `request_rate`, `concurrency` caps the requests in flight (arrivals beyond it wait).
    """
    loop = "closed" if plan.request_rate is None else f"{plan.request_rate:g} req/s"
    with tqdm(total=plan.requests, desc=f"C={plan.concurrency} ({loop})", unit="req",
              disable=not show_progress, leave=False) as bar:
        start = time.perf_counter()
        if plan.request_rate is None:
            results = await _closed_loop(send, plan, start, bar)
        else:
            results = await _open_loop(send, plan, start, bar)
    ends = [r.start + (r.e2e or 0.0) for r in results]
    wall = max(ends) if ends else 0.0
    return sorted(results, key=lambda r: r.index), wall
