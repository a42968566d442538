"""Admit and run the engine requests behind one API request: slots, fan-out of `n`, metrics, counts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator

from onebit.api.auth import KeyInfo
from onebit.api.responses import Timings
from onebit.api.state import ServerState
from onebit.protocol.fair_queue import ANONYMOUS
from onebit.protocol import GenerateRequest, InternalError, RequestError, SamplingParams, StepDelta
from onebit.router import RouterError, Ticket

log = logging.getLogger("onebit.api")


@dataclass
class Choice:
    """One engine request of an API request: which choice, which prompt, which params."""

    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str
    prompt_text: str | None = None
    user: str = ANONYMOUS  # whose request (set at admission, `onebit.api.admission`)
    priority: int = 0
    key: KeyInfo | None = None


def take_tickets(state: ServerState, count: int, user: str | None = None, priority: int = 0) -> list[Ticket]:
    """Reserve (or queue for) `count` slots now; all or nothing (the router's Overloaded when the
    queue is full, Unavailable when nothing can serve)."""
    tickets: list[Ticket] = []
    try:
        for _ in range(count):
            tickets.append(state.router.ticket(user=user, priority=priority))
    except RouterError:
        for ticket in tickets:
            ticket.close()
        raise
    return tickets


async def run_choice(state: ServerState, choice: Choice, ticket: Ticket) -> AsyncIterator[StepDelta]:
    """Stream one choice's deltas, recording metrics; raise a RequestError on any failure.

    A delta finishing with "error" or "abort" becomes an InternalError: a broken stream
    must never look finished. The router re-routes the choice if its backend fails
    before it streamed anything.
    """
    metrics = state.metrics
    arrival = time.monotonic()
    request = GenerateRequest(choice.request_id, choice.prompt_token_ids, choice.params, choice.prompt_text,
                              user=choice.user, priority=choice.priority)
    routed = state.router.stream(ticket, request)
    last = None
    finished = False
    itl = None  # the backend's labelled histogram, looked up once: this runs for every token
    try:
        async with contextlib.aclosing(routed.deltas()) as stream:
            async for delta in stream:
                name = routed.backend
                now = time.monotonic()
                if delta.token_ids or delta.text:
                    if last is None:
                        metrics.ttft.labels(name).observe(now - arrival)
                        itl = metrics.itl.labels(name)
                    else:
                        itl.observe(now - last)
                    last = now
                if delta.finished:
                    finished = True
                    reason = delta.finish_reason or "stop"
                    metrics.requests.labels(name, reason).inc()
                    metrics.prompt_tokens.labels(name).inc(delta.num_prompt_tokens or len(choice.prompt_token_ids))
                    metrics.generation_tokens.labels(name).inc(delta.num_output_tokens)
                    metrics.e2e.labels(name).observe(now - arrival)
                    state.limits.record(choice.user, choice.key, delta.num_output_tokens)
                    if reason in ("error", "abort"):
                        raise InternalError(delta.error or f"request {reason}ed by the engine")
                yield delta
    except RouterError:
        finished = True
        raise
    except RequestError:  # the backend failed, or refused the input
        finished = True
        metrics.requests.labels(routed.backend or "none", "error").inc()
        raise
    finally:
        if not finished and routed.backend is not None:  # the client went away: the backend aborted it
            metrics.requests.labels(routed.backend, "abort").inc()


class TokenCounter:
    """Completion tokens per choice: the ids streamed, or the backend's own final count when larger.
    Also per choice the prompt tokens the engine evaluated and found in its prefix cache, the drafted
    and accepted tokens, and when the first and last tokens came: the response's `timings`.

    A peer that streams text without token ids still reports how many it generated.
    """

    def __init__(self):
        self._start = time.monotonic()
        self._counts: dict[int, int] = {}
        self._drafts: dict[int, tuple[int, int]] = {}
        self._prompts: dict[int, tuple[int, int]] = {}  # index -> (prompt tokens, of which cached)
        self._first: float | None = None
        self._last: float | None = None

    def add(self, index: int, delta: StepDelta) -> None:
        """Count one delta of choice `index`."""
        count = self._counts.get(index, 0) + len(delta.token_ids)
        if delta.finished:
            count = max(count, delta.num_output_tokens)
        self._counts[index] = count
        self._drafts[index] = (delta.num_draft_tokens, delta.num_accepted_tokens)  # running totals
        if delta.num_prompt_tokens:
            self._prompts[index] = (delta.num_prompt_tokens, delta.num_cached_tokens)
        now = time.monotonic()
        if self._first is None and (delta.token_ids or delta.text or delta.finished):
            self._first = now
        self._last = now

    @property
    def total(self) -> int:
        """Completion tokens over all choices."""
        return sum(self._counts.values())

    def count(self, index: int) -> int:
        """Completion tokens of one choice."""
        return self._counts.get(index, 0)

    def cached(self, indices) -> int:
        """Prompt tokens of these choices that the engine found in its prefix cache."""
        return sum(self._prompts.get(i, (0, 0))[1] for i in indices)

    def timings(self, indices=None) -> Timings:
        """llama.cpp's `timings` over these choices (default: all): prompt and generation counts and
        milliseconds, and the draft fields when something was drafted."""
        indices = list(self._counts) if indices is None else list(indices)
        prompt = sum(self._prompts.get(i, (0, 0))[0] for i in indices)
        cached = self.cached(indices)
        predicted = sum(self._counts.get(i, 0) for i in indices)
        now = time.monotonic()
        first = self._first if self._first is not None else now
        prompt_ms = (first - self._start) * 1000.0
        predicted_ms = ((self._last or now) - first) * 1000.0
        timings = Timings(cache_n=cached, prompt_n=prompt - cached, prompt_ms=prompt_ms,
                          prompt_per_token_ms=prompt_ms / max(prompt - cached, 1),
                          prompt_per_second=_per_second(prompt - cached, prompt_ms), predicted_n=predicted,
                          predicted_ms=predicted_ms, predicted_per_token_ms=predicted_ms / max(predicted, 1),
                          predicted_per_second=_per_second(predicted, predicted_ms))
        drafted = sum(self._drafts.get(i, (0, 0))[0] for i in indices)
        if drafted:
            timings.draft_n = drafted
            timings.draft_n_accepted = sum(self._drafts.get(i, (0, 0))[1] for i in indices)
        return timings


def _per_second(count: int, ms: float) -> float:
    return count * 1000.0 / ms if ms > 0 else 0.0


async def merge_choices(state: ServerState, choices: list[Choice],
                        tickets: list[Ticket]) -> AsyncIterator[tuple[int, StepDelta]]:
    """Interleave the deltas of every choice as they arrive, as (choice index, delta)."""
    if len(choices) == 1:
        async with contextlib.aclosing(run_choice(state, choices[0], tickets[0])) as stream:
            async for delta in stream:
                yield choices[0].index, delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: Choice, ticket: Ticket) -> None:
        try:
            async with contextlib.aclosing(run_choice(state, choice, ticket)) as stream:
                async for delta in stream:
                    queue.put_nowait((choice.index, delta))
        except Exception as error:
            queue.put_nowait((choice.index, error))
        finally:
            queue.put_nowait((choice.index, None))

    tasks = [asyncio.create_task(pump(c, t)) for c, t in zip(choices, tickets)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
