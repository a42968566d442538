"""OpenAI's Responses API, text in and text out: `POST /v1/responses` (and `/responses`).

A stream is the documented event sequence, each event numbered (`sequence_number`):
response.created, response.in_progress, response.output_item.added, response.content_part.added,
response.output_text.delta ..., response.output_text.done, response.content_part.done,
response.output_item.done, then response.completed (or response.incomplete when
max_output_tokens cut it). A failure mid-stream is an `error` event, and nothing after it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from onebit.api.errors import as_request_error, error_body
from onebit.api.formatting import SSE_HEADERS
from onebit.api.openai_routes import post_v1_and_bare
from onebit.api.responses_request import ResponsesRequest, responses_params, responses_prompt
from onebit.api.single_choice import Outcome, deltas, run_whole, start
from onebit.api.state import ServerState, serving_state
from onebit.protocol import Cancelled

router = APIRouter()


class _Shapes:
    """The response object and its output item at any point of one response."""

    def __init__(self, state: ServerState, request: ResponsesRequest, outcome: Outcome):
        self.state = state
        self.request = request
        self.outcome = outcome
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())

    def part(self, text: str) -> dict:
        """The output_text content part."""
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, done: bool) -> dict:
        """The assistant message output item."""
        content = [self.part(self.outcome.content)] if done else []
        return {"type": "message", "id": self.item_id, "status": "completed" if done else "in_progress",
                "role": "assistant", "content": content}

    def response(self, status: str) -> dict:
        """The response object; usage once it ended."""
        done = status in ("completed", "incomplete")
        o = self.outcome
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.state.model_name, "output": [self.item(True)] if done else [],
                "instructions": self.request.instructions, "max_output_tokens": self.request.max_output_tokens,
                "temperature": o.choice.params.temperature, "top_p": o.choice.params.top_p,
                "parallel_tool_calls": False, "tool_choice": "none", "tools": [], "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "text": {"format": {"type": "text"}}, "metadata": self.request.metadata or {}, "usage": None}
        if done:
            body["usage"] = {"input_tokens": o.prompt_tokens, "output_tokens": o.output_tokens,
                             "total_tokens": o.prompt_tokens + o.output_tokens,
                             "input_tokens_details": {"cached_tokens": o.cached_tokens},
                             "output_tokens_details": {"reasoning_tokens": 0}}
        return body

    def status(self) -> str:
        """completed, or incomplete when the token limit ended it."""
        return "incomplete" if self.outcome.finish == "length" else "completed"


async def _events(shapes: _Shapes, ticket) -> AsyncIterator[str]:
    sequence = 0

    def event(kind: str, **data) -> str:
        nonlocal sequence
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': sequence - 1, **data})}\n\n"

    where = {"item_id": shapes.item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=shapes.response("in_progress"))
    yield event("response.in_progress", response=shapes.response("in_progress"))
    yield event("response.output_item.added", output_index=0, item=shapes.item(False))
    yield event("response.content_part.added", part=shapes.part(""), **where)
    try:
        async for delta in deltas(shapes.state, shapes.outcome, ticket):
            if delta.text:
                yield event("response.output_text.delta", delta=delta.text, logprobs=[], **where)
    except Exception as error:
        body = error_body(as_request_error(error, f"responses stream {shapes.id}"))["error"]
        yield event("error", code=body["code"], message=body["message"], param=body["param"])
        return
    text = shapes.outcome.content
    yield event("response.output_text.done", text=text, logprobs=[], **where)
    yield event("response.content_part.done", part=shapes.part(text), **where)
    yield event("response.output_item.done", output_index=0, item=shapes.item(True))
    status = shapes.status()
    yield event(f"response.{status}", response=shapes.response(status))


@post_v1_and_bare(router, "/responses", streams=True)
async def responses(request: ResponsesRequest, http: Request):
    """A model response: one JSON `response` object, or its event stream with `stream: true`."""
    state = serving_state(http, request.model)
    text, ids = responses_prompt(state, request)
    params = responses_params(state, request)
    outcome, ticket = start(state, ids, params, f"resp-{uuid.uuid4().hex}", text)
    shapes = _Shapes(state, request, outcome)
    if request.stream:
        return StreamingResponse(_events(shapes, ticket), media_type="text/event-stream", headers=SSE_HEADERS)
    try:
        await run_whole(http, state, outcome, ticket)
    except Cancelled:
        return Response(status_code=499)
    return JSONResponse(shapes.response(shapes.status()))
