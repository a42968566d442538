"""POST /v1/completions: text completion of one or several prompts, streaming and not."""

from __future__ import annotations

import contextlib
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from onebit.api.formatting import SSE_HEADERS, ChunkWriter, completion_logprobs, usage
from onebit.api.generation import (Choice, ClientGone, TokenCounter, collect_choices, guarded_sse, merge_choices,
                                   take_tickets, unless_disconnected)
from onebit.api.prepare import completion_prompt_texts, completion_prompts, completion_sampling_params
from onebit.api.protocol import CompletionRequest, CompletionResponse
from onebit.api.routes_chat import ERROR_RESPONSES

router = APIRouter()


def _prompt_tokens(choices: list[Choice], n: int) -> int:
    return sum(len(c.prompt_token_ids) for c in choices[::n])


async def _full(state, rid: str, choices: list[Choice], tickets, n: int):
    texts, counts, finish, logprobs = await collect_choices(state, choices, tickets)
    out = []
    for c in choices:
        lp = completion_logprobs(state, logprobs[c.index], 0) if c.params.logprobs is not None else None
        out.append({"index": c.index, "text": "".join(texts[c.index]), "logprobs": lp,
                    "finish_reason": finish[c.index]})
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": state.model_name,
            "choices": out, "usage": usage(_prompt_tokens(choices, n), counts.total)}
    if timings := counts.timings():
        body["timings"] = timings
    return JSONResponse(body)


async def _stream(state, request: CompletionRequest, rid: str, choices: list[Choice], tickets, n: int):
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    offsets = {c.index: 0 for c in choices}
    completion_tokens = TokenCounter()
    out = ChunkWriter(rid, "text_completion", state.model_name, include_usage, len(choices), completion_tokens)
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as stream:
        async for index, delta in stream:
            completion_tokens.add(index, delta)
            lp = None
            if request.logprobs is not None and delta.logprobs:
                lp = completion_logprobs(state, delta.logprobs, offsets[index])
            offsets[index] += len(delta.text)
            if delta.text or lp or (request.return_token_ids and delta.token_ids):
                item = {"index": index, "text": delta.text, "logprobs": lp, "finish_reason": None}
                if request.return_token_ids:
                    item["token_ids"] = delta.token_ids
                yield out.chunk([item])
            if delta.finished:
                yield out.finish({"index": index, "text": "", "logprobs": None, "finish_reason": delta.finish_reason})
    if (last := out.usage(_prompt_tokens(choices, n))) is not None:
        yield last


@router.post("/v1/completions", response_model=None,
             responses={200: {"model": CompletionResponse, "content": {"text/event-stream": {}}},
                        **ERROR_RESPONSES})
async def completions(request: CompletionRequest, http: Request):
    """Text completion: a JSON response, or an SSE stream with `stream: true`."""
    state = http.app.state.server
    state.require_ready()
    state.check_model(request.model)
    prompts = completion_prompts(state, request)
    texts = completion_prompt_texts(request)
    params = completion_sampling_params(state, request)
    rid = f"cmpl-{uuid.uuid4().hex}"
    n = len(params)
    choices = [Choice(p * n + j, ids, sp, f"{rid}-{p * n + j}", texts[p])
               for p, ids in enumerate(prompts) for j, sp in enumerate(params)]
    tickets = take_tickets(state, len(choices))
    if request.stream:
        return StreamingResponse(guarded_sse(_stream(state, request, rid, choices, tickets, n),
                                             f"completion stream {rid}"),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        return await unless_disconnected(http.receive, _full(state, rid, choices, tickets, n))
    except ClientGone:
        return Response(status_code=499)  # nobody is listening; the engine requests were aborted
