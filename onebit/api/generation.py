"""Run the engine requests behind one API request: slots, fan-out of `n`, metrics, errors."""

from __future__ import annotations

import asyncio
import logging
import contextlib
import time
from dataclasses import dataclass
from typing import AsyncIterator

from onebit.api.errors import APIError, context_overflow, internal_error, invalid_request, unavailable
from onebit.api.formatting import SSE_DONE, sse
from onebit.api.state import ServerState
from onebit.backends.base import BackendError, GenerateRequest, RequestRejected
from onebit.engine.outputs import StepDelta
from onebit.engine.sampling_params import SamplingParams
from onebit.router import QueueFull, RouterError, Ticket

log = logging.getLogger("onebit.api")


@dataclass
class Choice:
    """One engine request of an API request: which choice, which prompt, which params."""

    index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str
    prompt_text: str | None = None


async def guarded_sse(events: AsyncIterator[str], what: str) -> AsyncIterator[str]:
    """Relay a stream's SSE events, then `[DONE]`. A failure becomes an error event and the
    stream ends without `[DONE]`: a broken stream must never look finished."""
    try:
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                yield event
        yield SSE_DONE
    except APIError as error:
        yield sse(error.body())
    except Exception:
        log.exception("%s failed", what)
        yield sse(internal_error().body())


def router_error(error: RouterError) -> APIError:
    """503 for every reason the router could not place a request."""
    return unavailable(str(error), code="queue_full" if isinstance(error, QueueFull) else "unavailable")


def backend_error(error: BackendError) -> APIError:
    """400 when the engine rejected the input, else 500."""
    if isinstance(error, RequestRejected):
        details = error.details
        if "n_ctx" in details and "n_prompt_tokens" in details:
            return context_overflow(details["n_prompt_tokens"], details["n_ctx"])
        return invalid_request(details.get("message", "invalid request"), details.get("param"))
    return internal_error(str(error) or "backend failure")


def take_tickets(state: ServerState, count: int) -> list[Ticket]:
    """Reserve (or queue for) `count` slots now; all or nothing, 503 when the queue is full."""
    tickets: list[Ticket] = []
    try:
        for _ in range(count):
            tickets.append(state.router.ticket())
    except RouterError as error:
        for ticket in tickets:
            ticket.close()
        raise router_error(error) from None
    return tickets


async def run_choice(state: ServerState, choice: Choice, ticket: Ticket) -> AsyncIterator[StepDelta]:
    """Stream one choice's deltas, recording metrics; raise APIError on any failure.

    A delta finishing with "error" or "abort" becomes an APIError: a broken stream
    must never look finished. The router re-routes the choice if its backend fails
    before it streamed anything.
    """
    metrics = state.metrics
    arrival = time.monotonic()
    request = GenerateRequest(choice.request_id, choice.prompt_token_ids, choice.params, choice.prompt_text)
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
                    if reason in ("error", "abort"):
                        raise internal_error(delta.error or f"request {reason}ed by the engine")
                yield delta
    except RouterError as error:
        finished = True
        raise router_error(error) from None
    except BackendError as error:
        finished = True
        metrics.requests.labels(routed.backend or "none", "error").inc()
        raise backend_error(error) from None
    finally:
        if not finished and routed.backend is not None:  # the client went away: the backend aborted it
            metrics.requests.labels(routed.backend, "abort").inc()


class TokenCounter:
    """Completion tokens per choice: the ids streamed, or the backend's own final count when larger.
    Also the drafted and accepted tokens per choice, for the response's `timings`.

    A peer that streams text without token ids still reports how many it generated.
    """

    def __init__(self):
        self._counts: dict[int, int] = {}
        self._drafts: dict[int, tuple[int, int]] = {}

    def add(self, index: int, delta: StepDelta) -> None:
        """Count one delta of choice `index`."""
        count = self._counts.get(index, 0) + len(delta.token_ids)
        if delta.finished:
            count = max(count, delta.num_output_tokens)
        self._counts[index] = count
        self._drafts[index] = (delta.num_draft_tokens, delta.num_accepted_tokens)  # running totals

    @property
    def total(self) -> int:
        """Completion tokens over all choices."""
        return sum(self._counts.values())

    def timings(self) -> dict | None:
        """llama.cpp's `timings` draft fields over all choices, or None when nothing was drafted."""
        drafted = sum(d for d, _ in self._drafts.values())
        if not drafted:
            return None
        return {"draft_n": drafted, "draft_n_accepted": sum(a for _, a in self._drafts.values())}


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


class ClientGone(Exception):
    """The client disconnected before a non-streaming response was ready."""


async def _until_disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive, work):
    """Await `work`, but cancel it (aborting its engine requests) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watch.cancel()
        raise
    if not task.done() and watch.exception() is not None:
        watch = None  # receive() failed, which says nothing about the client: just wait
        await asyncio.wait({task})
    if task.done():
        if watch is not None:
            watch.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


async def collect_choices(state: ServerState, choices: list[Choice], tickets: list[Ticket]):
    """Run every choice to its end for a non-streaming response: per choice index, the text
    pieces, finish reason and logprobs, plus the token counter."""
    texts = {c.index: [] for c in choices}
    counts = TokenCounter()
    finish = {c.index: None for c in choices}
    logprobs = {c.index: [] for c in choices}
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as stream:
        async for index, delta in stream:
            texts[index].append(delta.text)
            counts.add(index, delta)
            if delta.logprobs:
                logprobs[index].extend(delta.logprobs)
            if delta.finished:
                finish[index] = delta.finish_reason
    return texts, counts, finish, logprobs
