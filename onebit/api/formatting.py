"""Response pieces in OpenAI's shapes: logprobs, usage, SSE events."""

from __future__ import annotations

import json
import time

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


class ChunkWriter:
    """The SSE chunks of one streamed response: id, object type, creation time and model on each;
    `usage: null` on content chunks while the client asked for usage; llama.cpp's `timings`
    (drafted/accepted counts) on the last chunk, which is the usage chunk when there is one."""

    def __init__(self, rid: str, obj: str, model: str, include_usage: bool, choices: int, counter):
        self.head = {"id": rid, "object": obj, "created": int(time.time()), "model": model}
        self.include_usage = include_usage
        self.unfinished = choices
        self.counter = counter  # a TokenCounter: completion tokens and draft counts so far

    def chunk(self, items: list[dict], timings: dict | None = None) -> str:
        """One chunk carrying these choice items."""
        payload = {**self.head, "choices": items}
        if self.include_usage:
            payload["usage"] = None
        if timings:
            payload["timings"] = timings
        return sse(payload)

    def finish(self, item: dict) -> str:
        """The chunk that ends one choice (its finish_reason); the last one carries the timings
        unless a usage chunk follows."""
        self.unfinished -= 1
        last = not self.unfinished and not self.include_usage
        return self.chunk([item], self.counter.timings() if last else None)

    def usage(self, prompt_tokens: int) -> str | None:
        """The final usage chunk when the client asked for one (stream_options.include_usage)."""
        if not self.include_usage:
            return None
        payload = {**self.head, "choices": [], "usage": usage(prompt_tokens, self.counter.total)}
        if timings := self.counter.timings():
            payload["timings"] = timings
        return sse(payload)
