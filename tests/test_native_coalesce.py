"""A stream that fell behind the engine takes its queued steps as one delta, in order, errors last."""

from __future__ import annotations

import asyncio

import pytest

from onebit.backends.base import BackendError, GenerateRequest
from onebit.backends.native import NativeBackend
from onebit.engine.config import EngineConfig
from onebit.engine.outputs import StepDelta, TokenLogprob
from onebit.engine.sampling_params import SamplingParams


class _Sent:
    def __init__(self):
        self.messages = []

    def send(self, message):
        self.messages.append(message)


def _backend() -> NativeBackend:
    backend = NativeBackend(EngineConfig(model="unused", device="cpu"), name="native-test")
    backend._state = "ready"  # as after start(), without a worker: the test plays the worker's part
    backend._writer = _Sent()
    return backend


def _step(i: int, finished: bool = False) -> StepDelta:
    return StepDelta("r", [i], f"<{i}>", finished, "length" if finished else None,
                     logprobs=[TokenLogprob(i, -0.5)], num_output_tokens=i + 1)


def test_then_concatenates_in_order_and_keeps_the_later_totals():
    merged = _step(0).then(_step(1)).then(_step(2, finished=True))
    assert merged.token_ids == [0, 1, 2] and merged.text == "<0><1><2>"
    assert [lp.token_id for lp in merged.logprobs] == [0, 1, 2]
    assert merged.finished and merged.finish_reason == "length" and merged.num_output_tokens == 3


@pytest.mark.parametrize("fail_after", [None, 3])
def test_queued_steps_arrive_as_one_delta(fail_after):
    backend = _backend()

    async def go():
        stream = backend.generate(GenerateRequest("r", [1, 2], SamplingParams()))
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the request is registered and waits for its first step
        queue = backend._streams["r"]
        queue.put_nowait(_step(0))
        got = [await first]
        for i in range(1, 5):  # four steps land before the consumer runs again
            queue.put_nowait(_step(i, finished=i == 4 and fail_after is None))
        if fail_after is not None:
            queue.put_nowait(BackendError("worker died"))
        try:
            async for delta in stream:
                got.append(delta)
        except BackendError as error:
            got.append(error)
        return got

    got = asyncio.run(go())
    assert got[0].token_ids == [0]
    assert got[1].token_ids == [1, 2, 3, 4] and got[1].text == "<1><2><3><4>"
    if fail_after is None:
        assert got[1].finished and len(got) == 2
    else:  # the tokens that arrived are delivered, then the failure: never a clean end
        assert not got[1].finished and isinstance(got[2], BackendError)


def test_leaving_a_stream_early_aborts_the_request_in_the_engine():
    backend = _backend()

    async def go():
        stream = backend.generate(GenerateRequest("r", [1, 2], SamplingParams()))
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        backend._streams["r"].put_nowait(_step(0))
        await first
        await stream.aclose()  # the client went away after one token

    asyncio.run(go())
    assert backend._writer.messages[-1] == ("abort", "r")
    assert "r" not in backend._streams
