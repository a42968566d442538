"""The worker's compact step message: deltas and slots cross the pipe packed as tuples and come
out equal, field by field, on the front's side (`onebit.backends.step_wire`)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import pickle
import threading

from onebit.backends.native import NativeBackend
from onebit.backends.native_worker import serve_engine
from onebit.backends.step_wire import pack_deltas, pack_slots, unpack_deltas, unpack_slots
from onebit.engine.config import EngineConfig
from onebit.engine.outputs import EngineStats, SlotInfo, StepDelta, TokenLogprob
from onebit.engine.sampling_params import SamplingParams
from onebit.protocol import GenerateRequest


def _deltas() -> list[StepDelta]:
    """One of every kind a step can carry: plain, with logprobs, finished, failed, an embedding."""
    return [
        StepDelta("a", [5], " x", num_prompt_tokens=3, num_output_tokens=1, num_cached_tokens=2),
        StepDelta("b", [6, 7], "yz", logprobs=[TokenLogprob(6, -0.25, [(6, -0.25), (9, -1.5)]), TokenLogprob(7, -2.0)],
                  num_prompt_tokens=4, num_output_tokens=2, num_draft_tokens=3, num_accepted_tokens=1),
        StepDelta("c", [8], "", True, "length", num_prompt_tokens=5, num_output_tokens=16),
        StepDelta("d", [], "", True, "error", error="internal error: boom"),
        StepDelta("e", [], "", True, "stop", embedding=[0.5, -0.25], num_prompt_tokens=7),
    ]


def test_deltas_cross_a_pickle_packed_and_come_back_equal():
    deltas = _deltas()
    wire = pickle.loads(pickle.dumps(pack_deltas(deltas), protocol=pickle.HIGHEST_PROTOCOL))
    assert all(type(item) is tuple for item in wire)
    assert unpack_deltas(wire) == deltas


def test_slots_come_back_named_after_the_front_backend():
    slots = [SlotInfo(0, "", True, "a", 12, 3, "batch"), SlotInfo(1, "", False)]
    back = unpack_slots(pickle.loads(pickle.dumps(pack_slots(slots))), "native-7")
    assert [s.backend for s in back] == ["native-7", "native-7"]
    assert [(s.id, s.is_processing, s.request_id, s.n_prompt_tokens, s.n_decoded, s.regime) for s in back] == \
        [(0, True, "a", 12, 3, "batch"), (1, False, None, 0, 0, None)]


class _TwoStepEngine:
    """Stands in for LLMEngine in serve_engine: each added request gets one running delta, then
    its finished one; reports two busy slots."""

    def __init__(self):
        self.todo: list[list[StepDelta]] = []

    def add_request(self, request_id, prompt_token_ids, params, **_):
        self.todo.append([StepDelta(request_id, [1], "p", num_prompt_tokens=len(prompt_token_ids),
                                    num_output_tokens=1),
                          StepDelta(request_id, [2], "q", True, "stop", num_prompt_tokens=len(prompt_token_ids),
                                    num_output_tokens=2)])

    def abort(self, request_id):
        pass

    def has_unfinished(self):
        return any(self.todo)

    def step(self):
        return [steps.pop(0) for steps in self.todo if steps]

    def stats(self):
        return EngineStats(num_running=len(self.todo))

    def slots(self):
        return [SlotInfo(0, "", True, "r1", 2, 1), SlotInfo(1, "", False)]


def test_the_worker_loop_sends_packed_steps_that_the_backend_delivers():
    """serve_engine over a real pipe, its messages fed to NativeBackend's handler as the event loop would."""
    front, worker = mp.Pipe(duplex=True)
    thread = threading.Thread(target=serve_engine, args=(_TwoStepEngine(), worker), daemon=True)
    thread.start()
    front.send(("add", "r1", [4, 5, 6], SamplingParams()))
    steps = [front.recv(), front.recv()]
    front.send(("stop",))
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert [m[0] for m in steps] == ["step", "step"]
    assert all(type(item) is tuple for m in steps for item in m[1])

    backend = NativeBackend(EngineConfig(model="unused", device="cpu"), name="native-test")
    backend._state = "ready"

    async def go():
        queue: asyncio.Queue = asyncio.Queue()
        backend._streams["r1"] = queue
        for message in steps:
            backend._handle(message)
        return [queue.get_nowait() for _ in range(queue.qsize())]

    got = asyncio.run(go())
    assert [(d.token_ids, d.text, d.finished, d.finish_reason, d.num_prompt_tokens) for d in got] == \
        [([1], "p", False, None, 3), ([2], "q", True, "stop", 3)]
    # The finished step carried the slots; the backend names them when asked.
    assert [(s.backend, s.request_id) for s in backend.slots()] == [("native-test", "r1"), ("native-test", None)]
    assert backend.stats().num_running == 1


def test_generate_streams_through_a_packed_step():
    backend = NativeBackend(EngineConfig(model="unused", device="cpu"), name="native-test")
    backend._state = "ready"
    backend._writer = type("Sent", (), {"send": lambda self, message: None})()

    async def go():
        stream = backend.generate(GenerateRequest("r", [1, 2], SamplingParams()))
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)
        backend._handle(("step", pack_deltas([StepDelta("r", [3], "t", True, "length", num_output_tokens=1)]),
                         None, None))
        return await first

    delta = asyncio.run(go())
    assert delta.token_ids == [3] and delta.finished and delta.finish_reason == "length"


def test_a_profiled_worker_loop_writes_its_profile_when_it_stops(tmp_path):
    """ONEBIT_WORKER_PROFILE's loop: the same messages, and a cProfile of serve_engine on stop."""
    import pstats

    from onebit.backends.native_worker import serve_engine_profiled

    path = tmp_path / "worker.prof"
    front, worker = mp.Pipe(duplex=True)
    thread = threading.Thread(target=serve_engine_profiled, args=(_TwoStepEngine(), worker, str(path)), daemon=True)
    thread.start()
    front.send(("add", "r1", [4, 5, 6], SamplingParams()))
    assert [front.recv()[0], front.recv()[0]] == ["step", "step"]
    front.send(("stop",))
    thread.join(timeout=10)
    assert not thread.is_alive()
    functions = {name for _, _, name in pstats.Stats(str(path)).stats}
    assert "serve_engine" in functions and "step" in functions
