"""The one pipeline behind both completion endpoints: admit -> fan out choices -> stream or collect.

What differs between chat and text completions (the response types, reasoning split, logprob
shapes, prompt counting) is the endpoint's Formatter (`onebit/api/formatters.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from onebit.api.errors import as_request_error, error_body
from onebit.api.formatters import Collected, Formatter
from onebit.api.formatting import SSE_DONE, SSE_HEADERS, ChunkWriter, TextPiece, sse
from onebit.api.admission import admit
from onebit.api.generation import Choice, TokenCounter, merge_choices
from onebit.api.protocol import SamplingFields
from onebit.api.queue_notice import queue_notices
from onebit.api.state import ServerState
from onebit.protocol import Cancelled
from onebit.router import Ticket


async def serve(http: Request, state: ServerState, fmt: Formatter, choices: list[Choice],
                request: SamplingFields) -> Response:
    """Admit the request and take its slots now (so a full queue is a 503, a key over its limits
    a 429, before any stream starts), then stream its chunks as SSE or answer with the whole
    response. `request` is the API request (its `stream`, `stream_options`, `user` and `priority`)."""
    tickets = admit(http, state, choices, request)
    if request.stream:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        events = stream_events(state, fmt, choices, tickets, include_usage)
        return StreamingResponse(guarded_sse(events, f"stream {fmt.rid}"), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    try:
        return await unless_disconnected(http.receive, respond(state, fmt, choices, tickets))
    except Cancelled:
        return Response(status_code=499)  # nobody is listening; the engine requests were aborted


async def stream_events(state: ServerState, fmt: Formatter, choices: list[Choice], tickets: list[Ticket],
                        include_usage: bool) -> AsyncIterator[str]:
    """The SSE chunks of every choice as their deltas arrive, then the usage chunk if asked for,
    then `[DONE]`. What one delta brings (its text, its choice's finish) goes out as one write, and
    the last delta's with the usage chunk and `[DONE]`: the client reads the end of the stream at once."""
    counter = TokenCounter()
    out = ChunkWriter(fmt.chunk_type, fmt.rid, fmt.chunk_object, state.model_name, include_usage, len(choices),
                      counter, state.system_fingerprint, fmt.text_item)
    async for comment in queue_notices(state.router, tickets):
        yield comment
    for item in fmt.opening():
        yield out.chunk([item])
    tail = ""
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as merged:
        async for index, delta in merged:
            counter.add(index, delta)
            item = fmt.piece(index, delta)
            events = "" if item is None else out.text(item) if type(item) is TextPiece else out.chunk([item])
            if delta.finished:
                events += out.finish(fmt.finish(index, delta))
                if not out.unfinished:
                    tail = events
                    continue
            if events:
                yield events
    if (last := out.usage(fmt.prompt_tokens(), fmt.cached_tokens(counter))) is not None:
        tail += last
    yield tail + SSE_DONE


async def respond(state: ServerState, fmt: Formatter, choices: list[Choice], tickets: list[Ticket]) -> Response:
    """Run every choice to its end; the endpoint's whole response."""
    collected = Collected(choices)
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as merged:
        async for index, delta in merged:
            collected.add(index, delta)
    return Response(fmt.response(collected).dump(), media_type="application/json")


async def guarded_sse(events: AsyncIterator[str], what: str) -> AsyncIterator[str]:
    """Relay a stream's SSE events (the last of which ends with `[DONE]`). A failure becomes an
    error event and the stream ends there, without `[DONE]`: a broken stream must never look finished."""
    try:
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                yield event
    except Exception as error:
        yield sse(error_body(as_request_error(error, what)))


async def _until_disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive, work):
    """Await `work`, but cancel it (aborting its engine requests) and raise Cancelled if the client
    goes away first."""
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
    raise Cancelled("the client went away before the response was ready")
