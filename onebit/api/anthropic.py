"""Anthropic's Messages API on the served model: `POST /v1/messages` (whole or streamed) and
`POST /v1/messages/count_tokens`, so clients built on the `anthropic` SDK run unchanged.

A stream is the documented event sequence: message_start, content_block_start, ping,
content_block_delta (text_delta) ..., content_block_stop, message_delta (stop_reason, usage),
message_stop. A failure mid-stream is an `error` event and the stream ends without message_stop.
"""

from __future__ import annotations

import json
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from onebit.api.anthropic_request import CountTokensRequest, MessagesRequest, messages_params, messages_prompt
from onebit.api.errors import as_request_error, error_body
from onebit.api.formatting import SSE_HEADERS
from onebit.api.openai_routes import ERROR_RESPONSES, STREAMING_RESPONSES
from onebit.api.single_choice import Outcome, deltas, run_whole, start
from onebit.api.state import ServerState, serving_state
from onebit.protocol import Cancelled

router = APIRouter()


def event(kind: str, data: dict) -> str:
    """One SSE event with its `event:` name, as the Messages API streams them."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def _stop_reason(state: ServerState, outcome: Outcome) -> tuple[str, str | None]:
    if outcome.finish == "length":
        return "max_tokens", None
    word = outcome.stop_word(state)
    return ("stop_sequence", word) if word is not None else ("end_turn", None)


def _usage(outcome: Outcome) -> dict:
    return {"input_tokens": outcome.prompt_tokens, "output_tokens": outcome.output_tokens,
            "cache_read_input_tokens": outcome.cached_tokens, "cache_creation_input_tokens": 0}


def _message(state: ServerState, rid: str, content: list, outcome: Outcome, stop: tuple | None) -> dict:
    reason, word = stop if stop else (None, None)
    return {"id": rid, "type": "message", "role": "assistant", "content": content, "model": state.model_name,
            "stop_reason": reason, "stop_sequence": word, "usage": _usage(outcome)}


async def _events(state: ServerState, rid: str, outcome: Outcome, ticket) -> AsyncIterator[str]:
    yield event("message_start", {"message": _message(state, rid, [], outcome, None)})
    yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
    yield event("ping", {})
    try:
        async for delta in deltas(state, outcome, ticket):
            if delta.text:
                yield event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": delta.text}})
    except Exception as error:
        body = error_body(as_request_error(error, f"messages stream {rid}"))["error"]
        yield event("error", {"error": {"type": body["type"], "message": body["message"]}})
        return
    reason, word = _stop_reason(state, outcome)
    yield event("content_block_stop", {"index": 0})
    yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": word},
                                  "usage": {"output_tokens": outcome.output_tokens}})
    yield event("message_stop", {})


@router.post("/v1/messages", response_model=None, responses=STREAMING_RESPONSES)
async def messages(request: MessagesRequest, http: Request):
    """A message from the model: one JSON `message` object, or its event stream with `stream: true`."""
    state = serving_state(http, request.model)
    text, ids = messages_prompt(state, request)
    params = messages_params(state, request)
    rid = f"msg_{uuid.uuid4().hex}"
    outcome, ticket = start(state, ids, params, rid, text)
    if request.stream:
        return StreamingResponse(_events(state, rid, outcome, ticket), media_type="text/event-stream",
                                 headers=SSE_HEADERS)
    try:
        await run_whole(http, state, outcome, ticket)
    except Cancelled:
        return Response(status_code=499)
    content = [{"type": "text", "text": outcome.content}]
    return JSONResponse(_message(state, rid, content, outcome, _stop_reason(state, outcome)))


@router.post("/v1/messages/count_tokens", responses=ERROR_RESPONSES)
async def count_tokens(request: CountTokensRequest, http: Request) -> dict:
    """How many input tokens these messages (and system prompt) take, without generating."""
    state = serving_state(http, request.model)
    return {"input_tokens": len(messages_prompt(state, request)[1])}
