"""llama-server's native completion API: `POST /completion` and `POST /infill`, in its own shapes.

A whole response is one object per prompt (a list when the request had several); a stream is one
`data:` event per piece of text, ending with the event that has `stop: true` and the whole
request's fields. Like llama-server, these streams send no `[DONE]`; a failed stream ends with an
error event and no `stop: true` event, so it never looks finished.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from onebit.api.errors import as_request_error, error_body
from onebit.api.formatting import SSE_HEADERS, sse
from onebit.api.generation import Choice, TokenCounter, merge_choices, take_tickets
from onebit.api.llama_fields import completion_probabilities, generation_settings, stop_fields
from onebit.api.llama_request import (InfillRequest, LlamaCompletionRequest, fim_prompt, llama_prompts,
                                      llama_sampling_params)
from onebit.api.openai_routes import STREAMING_RESPONSES
from onebit.api.pipeline import unless_disconnected
from onebit.api.state import ServerState, serving_state
from onebit.protocol import Cancelled, StepDelta

router = APIRouter()


class _Result:
    """One prompt's output so far."""

    def __init__(self, choice: Choice):
        self.choice = choice
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.logprobs: list = []
        self.finish: str | None = None

    def add(self, delta: StepDelta) -> None:
        """Take in one delta."""
        self.text.append(delta.text)
        self.tokens.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs or [])
        if delta.finished:
            self.finish = delta.finish_reason


def _final(state: ServerState, request: LlamaCompletionRequest, result: _Result, counter: TokenCounter,
           content: str) -> dict:
    """The fields of a finished prompt: content (whole, or "" at the end of a stream), stop reason,
    counts, settings and timings."""
    choice = result.choice
    whole = "".join(result.text)
    out = {"index": choice.index, "content": content, "tokens": result.tokens if request.return_tokens else [],
           "id_slot": request.id_slot, "stop": True, "model": state.model_name,
           "tokens_predicted": counter.count(choice.index), "tokens_evaluated": len(choice.prompt_token_ids),
           "generation_settings": generation_settings(state, choice.params, request.stream),
           "prompt": choice.prompt_text, "has_new_line": "\n" in whole, "truncated": False,
           **stop_fields(state, result.finish, whole, result.tokens, choice.params.stop),
           "tokens_cached": counter.cached([choice.index]), "timings": counter.timings([choice.index]).model_dump(
               exclude_none=True)}
    if request.n_probs and not request.stream:
        out["completion_probabilities"] = completion_probabilities(state, result.logprobs)
    return out


async def _collect(state: ServerState, request: LlamaCompletionRequest, choices: list[Choice], tickets) -> list:
    results = {c.index: _Result(c) for c in choices}
    counter = TokenCounter()
    async with contextlib.aclosing(merge_choices(state, choices, tickets)) as merged:
        async for index, delta in merged:
            counter.add(index, delta)
            results[index].add(delta)
    return [_final(state, request, r, counter, "".join(r.text)) for r in results.values()]


async def _events(state: ServerState, request: LlamaCompletionRequest, choices: list[Choice],
                  tickets) -> AsyncIterator[str]:
    results = {c.index: _Result(c) for c in choices}
    counter = TokenCounter()
    try:
        async with contextlib.aclosing(merge_choices(state, choices, tickets)) as merged:
            async for index, delta in merged:
                counter.add(index, delta)
                results[index].add(delta)
                if delta.text or delta.token_ids:
                    event = {"index": index, "content": delta.text, "tokens": delta.token_ids if request.return_tokens
                             else [], "stop": False, "id_slot": request.id_slot,
                             "tokens_predicted": counter.count(index),
                             "tokens_evaluated": len(results[index].choice.prompt_token_ids)}
                    if request.n_probs and delta.logprobs:
                        event["completion_probabilities"] = completion_probabilities(state, delta.logprobs)
                    yield sse(event)
                if delta.finished:
                    yield sse(_final(state, request, results[index], counter, ""))
    except Exception as error:
        yield sse(error_body(as_request_error(error, "llama-style stream")))


async def _serve(http: Request, state: ServerState, request: LlamaCompletionRequest, prompts, rid: str):
    params = llama_sampling_params(state, request)
    choices = [Choice(i, ids, params, f"{rid}-{i}", text) for i, (ids, text) in enumerate(prompts)]
    tickets = take_tickets(state, len(choices))
    if request.stream:
        return StreamingResponse(_events(state, request, choices, tickets), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    try:
        results = await unless_disconnected(http.receive, _collect(state, request, choices, tickets))
    except Cancelled:
        return JSONResponse(None, status_code=499)
    return JSONResponse(results if len(results) > 1 else results[0])


@router.post("/completion", response_model=None, responses=STREAMING_RESPONSES)
async def completion(request: LlamaCompletionRequest, http: Request):
    """llama-server's completion: a JSON object (a list for several prompts), or its SSE stream."""
    state = serving_state(http, request.model)
    return await _serve(http, state, request, llama_prompts(state, request.prompt), f"cmpl-{uuid.uuid4().hex}")


@router.post("/infill", response_model=None, responses=STREAMING_RESPONSES)
async def infill(request: InfillRequest, http: Request):
    """Fill in the middle between `input_prefix` and `input_suffix` (models with FIM tokens only)."""
    state = serving_state(http, request.model)
    return await _serve(http, state, request, [fim_prompt(state, request)], f"infill-{uuid.uuid4().hex}")


