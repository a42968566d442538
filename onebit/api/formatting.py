"""Response pieces in OpenAI's shapes: logprobs, usage, SSE events."""

from __future__ import annotations

import json

from onebit.api.state import ServerState
from onebit.engine.outputs import TokenLogprob


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The `usage` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(payload: dict) -> str:
    """One server-sent event carrying a JSON payload."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _entry(state: ServerState, token_id: int, logprob: float) -> dict:
    piece = state.piece(token_id)
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}


def chat_logprobs(state: ServerState, items: list[TokenLogprob]) -> dict:
    """Chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    content = []
    for item in items:
        entry = _entry(state, item.token_id, item.logprob)
        entry["top_logprobs"] = [_entry(state, t, lp) for t, lp in item.top]
        content.append(entry)
    return {"content": content}


def completion_logprobs(state: ServerState, items: list[TokenLogprob], text_offset: int) -> dict:
    """Legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for item in items:
        piece = state.piece(item.token_id)
        tokens.append(piece)
        token_logprobs.append(item.logprob)
        tops.append({state.piece(t): lp for t, lp in item.top})
        offsets.append(text_offset)
        text_offset += len(piece)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
