"""Drive one concurrency level: closed loop (C clients back to back) or open loop (Poisson arrivals).

`send(index)` performs one request and returns its RequestResult; the load generator only
decides when to call it, stamps each result's start relative to the level, and measures the
level's wall time from the first send to the last result. `drive` is the part a client
process runs for its share of a level (see procs.py); `run_level` is a whole level in this process.
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
OnResult = Callable[[RequestResult], None]

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


async def _closed_loop(send: Send, plan: LevelPlan, start: float, on_result: OnResult) -> list[RequestResult]:
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
            on_result(result)
            if result.failure in ("connection", "timeout"):
                await asyncio.sleep(FAILURE_PAUSE_S)

    await asyncio.gather(*(client() for _ in range(plan.concurrency)))
    return results


async def _open_loop(send: Send, plan: LevelPlan, start: float, on_result: OnResult) -> list[RequestResult]:
    rng = random.Random(plan.seed)
    gate = asyncio.Semaphore(plan.concurrency)
    results: list[RequestResult] = []

    async def one(index: int) -> None:
        async with gate:
            sent_at = time.perf_counter()
            result = _stamp(await send(index), sent_at, start)
            results.append(result)
            on_result(result)

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


async def drive(send: Send, plan: LevelPlan, start: float, on_result: OnResult | None = None) -> list[RequestResult]:
    """Send the plan's requests from `start` (a time.perf_counter() instant, now or just past).

    Each result's `start` is stamped relative to `start`; `on_result` sees every result as it
    ends. With `request_rate`, `concurrency` caps the requests in flight (arrivals beyond it wait).
    """
    on_result = on_result or (lambda result: None)
    if plan.request_rate is None:
        return await _closed_loop(send, plan, start, on_result)
    return await _open_loop(send, plan, start, on_result)


def level_wall(results: list[RequestResult]) -> float:
    """Seconds from the level's start to the end of its last request."""
    return max((r.start + (r.e2e or 0.0) for r in results), default=0.0)


def progress_bar(plan: LevelPlan, show: bool) -> tqdm:
    """The progress bar of one level (one tick per finished request)."""
    loop = "closed" if plan.request_rate is None else f"{plan.request_rate:g} req/s"
    return tqdm(total=plan.requests, desc=f"C={plan.concurrency} ({loop})", unit="req",
                disable=not show, leave=False)


async def run_level(send: Send, plan: LevelPlan, show_progress: bool = True) -> tuple[list[RequestResult], float]:
    """Run one level in this process; return its results (sorted by index) and its wall time in seconds."""
    with progress_bar(plan, show_progress) as bar:
        results = await drive(send, plan, time.perf_counter(), lambda result: bar.update(1))
    return sorted(results, key=lambda r: r.index), level_wall(results)
