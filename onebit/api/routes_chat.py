"""POST /v1/chat/completions, streaming and not."""

from __future__ import annotations

import dataclasses
import uuid

from fastapi import APIRouter, Request

from onebit.api.formatters import ChatFormatter
from onebit.api.generation import Choice
from onebit.api.pipeline import serve
from onebit.api.prepare import chat_prompt, chat_sampling_params
from onebit.api.openai_routes import post_v1_and_bare
from onebit.api.protocol import ChatCompletionRequest
from onebit.api.reasoning import prompt_opens_reasoning
from onebit.api.responses import ChatCompletionResponse
from onebit.api.state import serving_state
from onebit.api.tool_calls import plan_tools

router = APIRouter()


@post_v1_and_bare(router, "/chat/completions", ChatCompletionResponse, streams=True)
async def chat_completions(request: ChatCompletionRequest, http: Request):
    """Chat completion: a JSON response, or an SSE stream with `stream: true`."""
    state = serving_state(http, request.model)
    tools = plan_tools(state, request)
    prompt_text, ids = chat_prompt(state, request, tools.tools)
    params = chat_sampling_params(state, request, tools.grammar)
    if tools.format is not None and tools.format.name == "mistral":  # its [TOOL_CALLS] marker is a special token
        params = [dataclasses.replace(p, skip_special_tokens=False) for p in params]
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    choices = [Choice(i, ids, p, f"{rid}-{i}", prompt_text) for i, p in enumerate(params)]
    split = (request.reasoning_format or state.reasoning_format) != "none"
    fmt = ChatFormatter(state, rid, choices, split, split and prompt_opens_reasoning(prompt_text), tools)
    return await serve(http, state, fmt, choices, request)
