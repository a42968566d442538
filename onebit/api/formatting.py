"""Response pieces in OpenAI's shapes: logprobs, usage, SSE events and the chunks of a stream."""

from __future__ import annotations

import json
import time
from typing import Callable, NamedTuple

from pydantic import BaseModel

from onebit.api.responses import (ChatLogprobs, CompletionLogprobs, PromptTokensDetails, TokenLogprobs,
                                  TopLogprob, Timings, Usage)
from onebit.api.state import ServerState
from onebit.protocol import TokenLogprob


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
    """The `usage` object (`prompt_tokens_details.cached_tokens`: prefix-cache hits)."""
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


def sse(payload: BaseModel | dict) -> str:
    """One server-sent event carrying a response model (its set fields) or a JSON object."""
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json(exclude_unset=True)}\n\n"
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


_encode = json.JSONEncoder(ensure_ascii=False).encode  # made once: json.dumps(ensure_ascii=False) makes one a call


def json_string(text: str) -> str:
    """`text` as a JSON string literal, encoded as the response models encode it (UTF-8 kept, only
    quotes, backslashes and control characters escaped)."""
    return _encode(text)


SSE_DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _top(state: ServerState, token_id: int, logprob: float) -> TopLogprob:
    piece = state.piece(token_id)
    return TopLogprob(token=piece, logprob=logprob, bytes=list(piece.encode("utf-8")))


def chat_logprobs(state: ServerState, items: list[TokenLogprob]) -> ChatLogprobs:
    """Chat `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    content = []
    for item in items:
        piece = state.piece(item.token_id)
        content.append(TokenLogprobs(token=piece, logprob=item.logprob, bytes=list(piece.encode("utf-8")),
                                     top_logprobs=[_top(state, t, lp) for t, lp in item.top]))
    return ChatLogprobs(content=content)


def completion_logprobs(state: ServerState, items: list[TokenLogprob], text_offset: int) -> CompletionLogprobs:
    """Legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for item in items:
        piece = state.piece(item.token_id)
        tokens.append(piece)
        token_logprobs.append(item.logprob)
        tops.append({state.piece(t): lp for t, lp in item.top})
        offsets.append(text_offset)
        text_offset += len(piece)
    return CompletionLogprobs(tokens=tokens, token_logprobs=token_logprobs, top_logprobs=tops, text_offset=offsets)


class TextPiece(NamedTuple):
    """A stream chunk item that is one text field of one choice and nothing else (the chunk of
    almost every token): `ChunkWriter.text` renders it from a template instead of a model."""

    index: int
    field: str  # "text" (completions), "content" or "reasoning_content" (chat)
    text: str


# Stands in for the text when a template is rendered; NUL never occurs in an id, a model name or a number.
_MARK = "\x00onebit text\x00"
_MARK_JSON = json_string(_MARK)


class ChunkWriter:
    """The SSE chunks of one streamed response, as `chunk_type` models: id, object type, creation
    time and model on each; `usage: null` on content chunks while the client asked for usage;
    llama.cpp's `timings` (drafted/accepted counts) on the last chunk, which is the usage chunk
    when there is one.

    `text_item(index, field, text)` builds the chunk item of a TextPiece. The chunk of a TextPiece
    is the one `chunk([text_item(...)])` would send, byte for byte, without building and dumping
    models for every token: the chunk with a marker for the text is rendered once per (choice,
    field) and split around the marker; each token then only encodes its text."""

    def __init__(self, chunk_type: type[BaseModel], rid: str, obj: str, model: str, include_usage: bool,
                 choices: int, counter, system_fingerprint: str | None = None,
                 text_item: Callable[[int, str, str], BaseModel] | None = None):
        self.chunk_type = chunk_type
        self.head = {"id": rid, "object": obj, "created": int(time.time()), "model": model,
                     "system_fingerprint": system_fingerprint}
        self.include_usage = include_usage
        self.unfinished = choices
        self.counter = counter  # a TokenCounter: completion tokens and draft counts so far
        self.text_item = text_item
        self._templates: dict[tuple[int, str], tuple[str, str]] = {}

    def text(self, piece: TextPiece) -> str:
        """The chunk of one TextPiece (from the (choice, field)'s template)."""
        template = self._templates.get(piece[:2])
        if template is None:
            template = self._templates[piece[:2]] = self._template(piece.index, piece.field)
        return template[0] + json_string(piece.text) + template[1]

    def _template(self, index: int, field: str) -> tuple[str, str]:
        whole = self.chunk([self.text_item(index, field, _MARK)])
        if whole.count(_MARK_JSON) != 1:
            raise ValueError(f"the chunk template of choice {index} does not hold its text once")
        before, _, after = whole.partition(_MARK_JSON)
        return before, after

    def chunk(self, items: list, timings: Timings | None = None) -> str:
        """One chunk carrying these choice items."""
        fields = {**self.head, "choices": items}
        if self.include_usage:
            fields["usage"] = None
        if timings:
            fields["timings"] = timings
        return sse(self.chunk_type(**fields))

    def finish(self, item) -> str:
        """The chunk that ends one choice (its finish_reason); the last one carries the timings
        unless a usage chunk follows."""
        self.unfinished -= 1
        last = not self.unfinished and not self.include_usage
        return self.chunk([item], self.counter.timings() if last else None)

    def usage(self, prompt_tokens: int, cached_tokens: int = 0) -> str | None:
        """The final usage chunk when the client asked for one (stream_options.include_usage)."""
        if not self.include_usage:
            return None
        fields = {**self.head, "choices": [], "usage": usage(prompt_tokens, self.counter.total, cached_tokens)}
        if timings := self.counter.timings():
            fields["timings"] = timings
        return sse(self.chunk_type(**fields))
