"""Adaptive routing with fake backends: primary first, overflow, FIFO, exactly-once release, failures."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from onebit.backends.base import BackendError, EngineStats, GenerateRequest
from onebit.protocol import InvalidRequest
from onebit.engine.outputs import StepDelta
from onebit.engine.sampling_params import SamplingParams
from onebit.router import Router
from onebit.router.supervisor import Backoff, Supervisor

from router_fakes import StubBackend


class DyingBackend(StubBackend):
    """A fake that streams `steps` deltas per request and can die (failing its streams) and come back."""

    def __init__(self, name: str, capacity: int, steps: int = 3, delay: float = 0.001):
        self.name, self.capacity, self.steps, self.delay = name, capacity, steps, delay
        self.active: dict[str, asyncio.Queue] = {}
        self.peak = self.total = self.starts = 0
        self.first_delay = 0.0  # seconds before the first delta (a request "in the engine's queue")
        self.with_ids = True  # False: stream text only, as a peer that sends no token ids
        self.requests: list[GenerateRequest] = []

    async def start(self) -> None:
        self.starts += 1
        await super().start()

    def die(self) -> None:
        for queue in self.active.values():
            queue.put_nowait(BackendError(f"{self.name} died"))
        self.set_state("down")

    async def generate(self, request: GenerateRequest):
        if self._state != "ready":
            raise BackendError(f"{self.name} is {self._state}")
        if request.prompt_token_ids == [666]:
            raise InvalidRequest("bad prompt", "prompt")
        queue: asyncio.Queue = asyncio.Queue()
        self.active[request.request_id] = queue
        self.requests.append(request)
        self.total += 1
        self.peak = max(self.peak, len(self.active))
        assert len(self.active) <= self.capacity, "router overfilled a backend"

        async def feed():
            await asyncio.sleep(self.first_delay)
            for i in range(self.steps):
                await asyncio.sleep(self.delay)
                last = i == self.steps - 1
                queue.put_nowait(StepDelta(request.request_id, [i] if self.with_ids else [], "x", finished=last,
                                           finish_reason="length" if last else None, num_output_tokens=i + 1))

        task = asyncio.create_task(feed())
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            task.cancel()
            del self.active[request.request_id]

    def stats(self):
        return EngineStats(num_running=len(self.active))


def _request(i: int, prompt=(1, 2)) -> GenerateRequest:
    return GenerateRequest(f"r{i}", list(prompt), SamplingParams())


def _check(router: Router) -> None:
    for route in router.routes:
        assert 0 <= route.in_flight <= route.limit, (route.name, route.in_flight)


async def _consume(router: Router, i: int, log: list | None = None) -> tuple[str, int]:
    stream = router.stream(router.ticket(), _request(i))
    count = 0
    async with contextlib.aclosing(stream.deltas()) as deltas:
        async for delta in deltas:
            if log is not None and count == 0:
                log.append((i, stream.backend))
            _check(router)
            count += len(delta.token_ids)
    return stream.backend, count


def test_burst_of_500_at_8_fills_primary_then_secondary_then_queue_in_order():
    primary, secondary = DyingBackend("primary", 8), DyingBackend("secondary", 16)
    router = Router([primary, secondary], max_queue=1000)
    order: list = []

    async def go():
        tasks = [asyncio.create_task(_consume(router, i, order)) for i in range(500)]
        await asyncio.sleep(0)
        # Every ticket was taken synchronously: 8 on the primary, 16 on the secondary, 476 queued.
        assert [r.in_flight for r in router.routes] == [8, 16] and router.queue_size == 476
        return await asyncio.gather(*tasks)

    results = asyncio.run(go())
    assert [name for name, _ in results[:8]] == ["primary"] * 8
    assert [name for name, _ in results[8:24]] == ["secondary"] * 16
    assert all(count == 3 for _, count in results)
    assert primary.peak == 8 and secondary.peak == 16
    assert [i for i, _ in order][24:] == sorted(i for i, _ in order[24:]), "the queue is FIFO"
    assert [r.in_flight for r in router.routes] == [0, 0] and router.queue_size == 0
    assert sum(r.served for r in router.routes) == 500 and sum(r.completed for r in router.routes) == 500


@pytest.mark.parametrize("overflow, clients, primary_share", [
    ("spill", 12, (30, 50)),  # the primary stays full: a third of 120 requests
    ("switch", 12, (4, 4)),  # only the first wave: after it the load never drops under 4
    ("switch", 3, (120, 120)),  # under the primary's limit everything stays on it
])
def test_overflow_policy_under_steady_closed_loop_load(overflow, clients, primary_share):
    primary, secondary = DyingBackend("primary", 4), DyingBackend("secondary", 16)
    router = Router([primary, secondary], overflow=overflow)

    async def client(c: int) -> list[str]:
        return [(await _consume(router, c * 100 + j))[0] for j in range(120 // clients)]

    async def go():
        return await asyncio.gather(*(client(c) for c in range(clients)))

    names = [n for per_client in asyncio.run(go()) for n in per_client]
    low, high = primary_share
    assert low <= names.count("primary") <= high, names.count("primary")
    assert len(names) == 120 and [r.in_flight for r in router.routes] == [0, 0]


def test_cancel_while_queued_and_while_streaming_releases_each_slot_once():
    primary, secondary = DyingBackend("p", 2, steps=10_000), DyingBackend("s", 2, steps=10_000)
    router = Router([primary, secondary], max_queue=100)

    async def go():
        tasks = [asyncio.create_task(_consume(router, i)) for i in range(10)]
        await asyncio.sleep(0.02)
        assert [r.in_flight for r in router.routes] == [2, 2] and router.queue_size == 6
        tasks[7].cancel()  # queued
        tasks[0].cancel()  # streaming on the primary
        await asyncio.sleep(0.02)
        _check(router)
        assert [r.in_flight for r in router.routes] == [2, 2] and router.queue_size == 4
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert [r.in_flight for r in router.routes] == [0, 0] and router.queue_size == 0
        assert not primary.active and not secondary.active

    asyncio.run(go())


def test_dead_backend_reroutes_unstarted_requests_and_migrates_streaming_ones():
    primary, secondary = DyingBackend("p", 4, steps=10_000, delay=0.002), DyingBackend("s", 4, steps=3)
    router = Router([primary, secondary], max_queue=100, supervisor=None)

    async def go():
        first: list = []
        streaming = [asyncio.create_task(_consume(router, i, first)) for i in range(2)]
        while len(first) < 2:  # wait until both have streamed from the primary
            await asyncio.sleep(0.001)
        primary.first_delay = 10.0  # the next two sit in the primary's engine queue
        waiting = [asyncio.create_task(_consume(router, i)) for i in range(2, 4)]
        queued = [asyncio.create_task(_consume(router, i)) for i in range(4, 12)]  # 4 on s, 4 in the queue
        await asyncio.sleep(0.005)
        assert router.routes[0].in_flight == 4
        primary.die()
        results = await asyncio.gather(*streaming, *waiting, *queued)
        assert all(name == "s" for name, _ in results)
        assert [count for _, count in results[2:]] == [3] * 10  # re-sent whole: nothing was streamed
        moved = {r.request_id: r for r in secondary.requests if r.resumed is not None}
        assert sorted(moved) == ["r0", "r1"]
        for i, (_, count) in enumerate(results[:2]):
            request = moved[f"r{i}"]
            done = request.resumed.num_generated
            # It goes on from the prompt plus the tokens streamed, which the client got once each.
            assert done > 0 and request.prompt_token_ids == [1, 2] + list(range(done))
            assert request.resumed.text == "x" * done and request.params.max_tokens == 16 - done
            assert count == done + 3
        assert [r.in_flight for r in router.routes] == [0, 0] and router.queue_size == 0
        assert router.routes[0].failed == 0

    asyncio.run(go())


def test_a_stream_without_token_ids_cannot_migrate_and_fails():
    primary, secondary = DyingBackend("p", 1, steps=10_000), DyingBackend("s", 1)
    primary.with_ids = False
    router = Router([primary, secondary], supervisor=None)

    async def go():
        task = asyncio.create_task(_consume(router, 0))
        await asyncio.sleep(0.02)
        primary.die()
        with pytest.raises(BackendError):
            await task
        assert router.routes[0].failed == 1 and secondary.total == 0 and router.in_flight == 0

    asyncio.run(go())


def test_rejected_input_is_not_rerouted():
    router = Router([DyingBackend("p", 1), DyingBackend("s", 1)], supervisor=None)

    async def go():
        stream = router.stream(router.ticket(), _request(0, prompt=[666]))
        with pytest.raises(InvalidRequest):
            async for _ in stream.deltas():
                pass
        assert stream.attempts == 1 and router.in_flight == 0

    asyncio.run(go())


def test_supervisor_restarts_a_down_backend_with_backoff():
    primary, secondary = DyingBackend("p", 1), DyingBackend("s", 1)
    fails = {"left": 2}
    real_start = primary.start

    async def flaky_start():
        primary.starts += 1
        if fails["left"]:
            fails["left"] -= 1
            primary.set_state("down")
            raise BackendError("not yet")
        await real_start()

    primary.start = flaky_start
    supervisor = Supervisor(Backoff(initial=0.01, maximum=0.04))
    router = Router([primary, secondary], supervisor=supervisor)

    async def go():
        await router.start()
        primary.die()
        assert router.state == "ready"  # the secondary still serves
        for _ in range(200):
            await asyncio.sleep(0.01)
            if primary.state == "ready":
                break
        assert primary.state == "ready" and fails["left"] == 0  # came back after two failed restarts
        name, _ = await _consume(router, 1)
        assert name == "p"
        await router.stop()

    asyncio.run(go())


def test_start_survives_one_failing_backend_but_not_all():
    class Broken(DyingBackend):
        async def start(self):
            self.set_state("down")
            raise BackendError("cannot load")

    async def go(backends):
        router = Router(backends, supervisor=Supervisor(Backoff(initial=60)))
        try:
            await router.start()
            return router.state
        finally:
            await router.stop()

    assert asyncio.run(go([Broken("a", 1), DyingBackend("b", 1)])) == "ready"
    with pytest.raises(BackendError):
        asyncio.run(go([Broken("a", 1), Broken("b", 1)]))
