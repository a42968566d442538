"""Fake backends for the router's unit tests: no engine, no process, only what the router sees."""

from __future__ import annotations

import asyncio

from onebit.backends.base import Backend, EngineStats, GenerateRequest
from onebit.engine.outputs import StepDelta


class StubBackend(Backend):
    """A backend with nothing behind it: "ready" until `set_state` says otherwise (the router is told),
    no slots to show, empty stats, abort a no-op. A fake adds `generate`."""

    kind = "fake"
    _state = "ready"

    @property
    def state(self) -> str:
        return self._state

    def set_state(self, state: str) -> None:
        """Change state and tell the router, as a real backend does."""
        self._state = state
        if self.on_state_change:
            self.on_state_change()

    async def start(self) -> None:
        self.set_state("ready")

    async def stop(self) -> None:
        self.set_state("stopped")

    async def abort(self, request_id: str) -> None:
        pass

    def slots(self):
        return []

    def stats(self):
        return EngineStats()


class CountingBackend(StubBackend):
    """A fake whose token at each position is the position itself, one token per `delay` s, up to
    max_tokens: a stream continued anywhere from prompt + tokens so far reads as one count. It records
    the requests it was sent and how many streams were aborted; `kind` is what migration sees."""

    def __init__(self, name: str, capacity: int, delay: float = 0.002, kind: str = "fake"):
        self.name, self.capacity, self.delay, self.kind = name, capacity, delay, kind
        self.requests: list[GenerateRequest] = []
        self.aborted = 0
        self.active = 0

    async def generate(self, request: GenerateRequest):
        self.requests.append(request)
        self.active += 1
        assert self.active <= self.capacity, "router overfilled a backend"
        start, n = len(request.prompt_token_ids), request.params.max_tokens
        finished = False
        try:
            for i in range(n):
                await asyncio.sleep(self.delay)
                finished = i == n - 1
                yield StepDelta(request.request_id, [start + i], f"<{start + i}>", finished,
                                "length" if finished else None, num_prompt_tokens=start, num_output_tokens=i + 1)
        finally:
            self.active -= 1
            if not finished:
                self.aborted += 1
