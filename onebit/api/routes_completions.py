"""POST /v1/completions: text completion of one or several prompts, streaming and not."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request

from onebit.api.formatters import CompletionFormatter
from onebit.api.generation import Choice
from onebit.api.openai_routes import post_v1_and_bare
from onebit.api.pipeline import serve
from onebit.api.prepare import completion_prompt_texts, completion_prompts, completion_sampling_params
from onebit.api.protocol import CompletionRequest
from onebit.api.responses import CompletionResponse
from onebit.api.state import serving_state

router = APIRouter()


@post_v1_and_bare(router, "/completions", CompletionResponse, streams=True)
async def completions(request: CompletionRequest, http: Request):
    """Text completion: a JSON response, or an SSE stream with `stream: true`."""
    state = serving_state(http, request.model)
    prompts = completion_prompts(state, request)
    texts = completion_prompt_texts(request)
    if request.suffix is not None:  # the prompt sent is the FIM prompt, not the text the client sent
        texts = [None] * len(texts)
    params = completion_sampling_params(state, request)
    rid = f"cmpl-{uuid.uuid4().hex}"
    n = len(params)
    choices = [Choice(p * n + j, ids, sp, f"{rid}-{p * n + j}", texts[p])
               for p, ids in enumerate(prompts) for j, sp in enumerate(params)]
    fmt = CompletionFormatter(state, rid, choices, n, request.return_token_ids, request.echo)
    return await serve(http, state, fmt, choices, request)
