"""Hand-over with fake backends: when the load falls, overflow streams move to the primary once each,
and every client stream stays whole (no token missing or repeated)."""

from __future__ import annotations

import asyncio
import contextlib

from onebit.backends.base import GenerateRequest
from onebit.engine.outputs import StepDelta
from onebit.engine.sampling_params import SamplingParams
from onebit.router import Router

from router_fakes import CountingBackend


async def _consume(router: Router, i: int, max_tokens: int) -> list[StepDelta]:
    request = GenerateRequest(f"r{i}", [7, 7], SamplingParams(max_tokens=max_tokens))
    async with contextlib.aclosing(router.stream(router.ticket(), request).deltas()) as deltas:
        return [delta async for delta in deltas]


def test_overflow_streams_move_to_the_primary_once_when_it_frees():
    # The short requests yield without sleeping, so they end long before a long one's first token.
    primary, overflow = CountingBackend("p", 2, delay=0), CountingBackend("o", 4, delay=0.02)
    router = Router([primary, overflow], supervisor=None, overflow="spill", hand_over=True)

    async def go():
        await router.start()
        # Two short requests fill the primary, four long ones overflow; as the short ones end, long
        # ones move to the primary's free slots.
        tasks = [asyncio.create_task(_consume(router, i, 5 if i < 2 else 40)) for i in range(6)]
        results = await asyncio.gather(*tasks)
        for deltas in results:
            tokens = [t for d in deltas for t in d.token_ids]
            assert tokens == list(range(2, 2 + len(tokens)))  # every position once, in order
            assert "".join(d.text for d in deltas) == "".join(f"<{t}>" for t in tokens)
            assert deltas[-1].finished and deltas[-1].num_output_tokens == len(tokens)
            assert all(d.num_prompt_tokens == 2 for d in deltas)
        assert [len([t for d in r for t in d.token_ids]) for r in results] == [5, 5, 40, 40, 40, 40]
        moved = [r for r in primary.requests if r.resumed is not None]
        # The first two free primary slots go to two overflow streams at once; later ones to the others.
        assert router.handover.moves == len(moved) == overflow.aborted >= 2
        assert len({r.request_id for r in moved}) == len(moved)  # each request moved once at most
        assert {r.request_id for r in moved} <= {"r2", "r3", "r4", "r5"}
        for request in moved:
            done = request.resumed.num_generated
            assert request.prompt_token_ids == [7, 7] + list(range(2, 2 + done))
            assert request.params.max_tokens == 40 - done
        assert router.in_flight == 0 and [r.in_flight for r in router.routes] == [0, 0]

    asyncio.run(go())


def test_without_hand_over_nothing_moves():
    primary, overflow = CountingBackend("p", 2, delay=0.001), CountingBackend("o", 4, delay=0.005)
    router = Router([primary, overflow], supervisor=None, overflow="spill")

    async def go():
        await router.start()
        await asyncio.gather(*(_consume(router, i, 5 if i < 2 else 20) for i in range(6)))
        assert router.handover is None and len(primary.requests) == 2 and overflow.aborted == 0

    asyncio.run(go())
