"""Router unit tests with fake backends: atomic choose-and-reserve, FIFO queue, exactly-once release."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import pytest

from onebit.backends.base import GenerateRequest
from onebit.engine.outputs import StepDelta
from onebit.engine.sampling_params import SamplingParams
from onebit.router import NoBackendAvailable, QueueFull, Router

from router_fakes import StubBackend


class FakeBackend(StubBackend):
    """Counts its own concurrent streams; each stream yields `steps` deltas."""

    def __init__(self, name: str, capacity: int, steps: int = 3):
        self.name, self.capacity, self.steps = name, capacity, steps
        self.active = self.peak = self.total = 0

    async def generate(self, request: GenerateRequest):
        self.active += 1
        self.total += 1
        self.peak = max(self.peak, self.active)
        assert self.active <= self.capacity, "router overfilled a backend"
        try:
            for i in range(self.steps):
                await asyncio.sleep(0.001)
                yield StepDelta(request.request_id, [i], "x", finished=i == self.steps - 1,
                                finish_reason="length" if i == self.steps - 1 else None)
        finally:
            self.active -= 1


def _request(i: int) -> GenerateRequest:
    return GenerateRequest(f"r{i}", [1, 2], SamplingParams())


def _check(router: Router) -> None:
    for route in router.routes:
        assert 0 <= route.in_flight <= route.limit


async def _burst(router: Router, n: int, order: list[int] | None = None) -> list[str]:
    async def one(i: int) -> str:
        async with router.reserve() as lease:
            _check(router)
            if order is not None:
                order.append(i)
            async with contextlib.aclosing(lease.backend.generate(_request(i))) as stream:
                async for _ in stream:
                    _check(router)
            return lease.backend.name

    return await asyncio.gather(*(one(i) for i in range(n)))


def test_burst_of_500_never_exceeds_capacity():
    backend = FakeBackend("a", 8)
    router = Router([backend], max_queue=1000)
    names = asyncio.run(_burst(router, 500))
    assert names == ["a"] * 500
    assert backend.peak == 8 and backend.total == 500
    assert router.routes[0].in_flight == 0 and router.queue_size == 0


def test_adaptive_shape_primary_first_then_secondary_then_fifo_queue():
    primary, secondary = FakeBackend("primary", 64), FakeBackend("secondary", 16)
    router = Router([primary, secondary], limits=[8, 16], max_queue=1000)
    order: list[int] = []
    names = asyncio.run(_burst(router, 500, order))
    assert primary.peak == 8 and secondary.peak == 16
    assert names[:8] == ["primary"] * 8 and names[8:24] == ["secondary"] * 16
    assert order[:24] == list(range(24))
    assert order[24:] == sorted(order[24:]), "queued requests are served in arrival order"
    assert [r.in_flight for r in router.routes] == [0, 0]
    assert router.routes[0].served + router.routes[1].served == 500


def test_cancellation_while_queued_and_while_streaming_releases_once():
    backend = FakeBackend("a", 2, steps=1000)
    router = Router([backend], max_queue=100)

    async def go():
        async def consume(i):
            async with router.reserve() as lease:
                async for _ in lease.backend.generate(_request(i)):
                    pass

        tasks = [asyncio.create_task(consume(i)) for i in range(10)]
        await asyncio.sleep(0.02)
        assert router.routes[0].in_flight == 2 and router.queue_size == 8
        tasks[5].cancel()  # queued
        tasks[0].cancel()  # streaming
        await asyncio.sleep(0.01)
        assert router.routes[0].in_flight == 2 and router.queue_size == 6
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert router.routes[0].in_flight == 0 and router.queue_size == 0

    asyncio.run(go())


def test_burst_with_random_cancellations_balances():
    backend = FakeBackend("a", 4, steps=5)
    router = Router([backend], max_queue=1000)

    async def go():
        async def one(i):
            async with router.reserve() as lease:
                async with contextlib.aclosing(lease.backend.generate(_request(i))) as stream:
                    async for _ in stream:
                        _check(router)

        tasks = [asyncio.create_task(one(i)) for i in range(500)]
        for step in range(50):
            await asyncio.sleep(0.001)
            tasks[(step * 37) % 500].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    assert router.routes[0].in_flight == 0 and router.queue_size == 0 and backend.active == 0


def test_queue_full_is_immediate():
    router = Router([FakeBackend("a", 1)], max_queue=2)

    async def go():
        held = await router.acquire()
        waiters = [asyncio.create_task(router.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            router.ticket()
        held.release()
        held.release()  # a second release is a no-op
        first = await waiters[0]
        first.release()
        (await waiters[1]).release()
        assert router.routes[0].in_flight == 0

    asyncio.run(go())


def test_dropped_ticket_releases_its_slot():
    router = Router([FakeBackend("a", 1)])

    async def go():
        ticket = router.ticket()
        assert router.routes[0].in_flight == 1
        del ticket
        gc.collect()
        assert router.routes[0].in_flight == 0

    asyncio.run(go())


def test_backend_down_fails_waiters():
    backend = FakeBackend("a", 1)
    router = Router([backend])

    async def go():
        held = await router.acquire()
        waiter = asyncio.create_task(router.acquire())
        await asyncio.sleep(0)
        backend.set_state("down")
        with pytest.raises(NoBackendAvailable):
            await waiter
        held.release()
        with pytest.raises(NoBackendAvailable):
            router.ticket()

    asyncio.run(go())
