"""POST /v1/chat/completions, streaming and not."""

from __future__ import annotations

import contextlib
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from onebit.api.formatting import SSE_HEADERS, ChunkWriter, chat_logprobs, usage
from onebit.api.generation import (Choice, ClientGone, TokenCounter, collect_choices, guarded_sse, merge_choices,
                                   take_tickets, unless_disconnected)
from onebit.api.prepare import chat_prompt, chat_sampling_params
from onebit.api.protocol import ChatCompletionRequest, ChatCompletionResponse, ErrorResponse
from onebit.api.reasoning import ReasoningSplitter, prompt_opens_reasoning

router = APIRouter()

ERROR_RESPONSES = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}


def _split(text: str, in_reasoning: bool) -> tuple[str | None, str]:
    splitter = ReasoningSplitter(in_reasoning)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.flush()
    reasoning, content = r1 + r2, c1 + c2
    if not reasoning and not in_reasoning:
        return None, content
    return reasoning.strip("\n"), content.lstrip("\n")


async def _full(state, request: ChatCompletionRequest, rid: str, choices, tickets, split, in_reasoning):
    texts, counts, finish, logprobs = await collect_choices(state, choices, tickets)
    out = []
    for c in choices:
        text = "".join(texts[c.index])
        reasoning, content = _split(text, in_reasoning) if split else (None, text)
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        lp = chat_logprobs(state, logprobs[c.index]) if c.params.logprobs is not None else None
        out.append({"index": c.index, "message": message, "logprobs": lp, "finish_reason": finish[c.index]})
    body = {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": state.model_name,
            "choices": out, "usage": usage(len(choices[0].prompt_token_ids), counts.total)}
    if timings := counts.timings():
        body["timings"] = timings
    return JSONResponse(body)


async def _stream(state, request: ChatCompletionRequest, rid: str, choices, tickets, split, in_reasoning):
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    want_logprobs = choices[0].params.logprobs is not None
    completion_tokens = TokenCounter()
    out = ChunkWriter(rid, "chat.completion.chunk", state.model_name, include_usage, len(choices), completion_tokens)
    splitters = {c.index: ReasoningSplitter(in_reasoning) for c in choices}
    for c in choices:
        yield out.chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}])
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as stream:
        async for index, delta in stream:
            completion_tokens.add(index, delta)
            if split:
                reasoning, content = splitters[index].feed(delta.text)
                if delta.finished:
                    r, c = splitters[index].flush()
                    reasoning, content = reasoning + r, content + c
            else:
                reasoning, content = "", delta.text
            body: dict = {}
            if reasoning:
                body["reasoning_content"] = reasoning
            if content or (not reasoning and delta.logprobs):
                body["content"] = content
            lp = chat_logprobs(state, delta.logprobs) if want_logprobs and delta.logprobs else None
            if body or lp:
                yield out.chunk([{"index": index, "delta": body, "logprobs": lp, "finish_reason": None}])
            if delta.finished:
                yield out.finish({"index": index, "delta": {}, "logprobs": None, "finish_reason": delta.finish_reason})
    if (last := out.usage(len(choices[0].prompt_token_ids))) is not None:
        yield last


@router.post("/v1/chat/completions", response_model=None,
             responses={200: {"model": ChatCompletionResponse, "content": {"text/event-stream": {}}},
                        **ERROR_RESPONSES})
async def chat_completions(request: ChatCompletionRequest, http: Request):
    """Chat completion: a JSON response, or an SSE stream with `stream: true`."""
    state = http.app.state.server
    state.require_ready()
    state.check_model(request.model)
    prompt_text, ids = chat_prompt(state, request)
    params = chat_sampling_params(state, request)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    choices = [Choice(i, ids, p, f"{rid}-{i}", prompt_text) for i, p in enumerate(params)]
    split = request.reasoning_format != "none"
    in_reasoning = split and prompt_opens_reasoning(prompt_text)
    tickets = take_tickets(state, len(choices))
    if request.stream:
        return StreamingResponse(guarded_sse(_stream(state, request, rid, choices, tickets, split, in_reasoning),
                                             f"chat stream {rid}"),
                                 media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        return await unless_disconnected(http.receive, _full(state, request, rid, choices, tickets, split, in_reasoning))
    except ClientGone:
        return Response(status_code=499)  # nobody is listening; the engine requests were aborted
