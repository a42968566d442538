"""The OpenAI wire format a remote backend speaks: request bodies out, SSE chunks in, errors mapped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator

from onebit.backends.base import BackendError
from onebit.protocol import (ContextOverflow, GenerateRequest, InvalidRequest, RequestError, SamplingParams,
                             StepDelta, TokenLogprob)
from onebit.protocol.fair_queue import ANONYMOUS

# Fields most OpenAI-compatible servers (1bit, vLLM, llama-server) take beyond OpenAI's own.
_EXTRA_DEFAULTS = {"top_k": 0, "min_p": 0.0, "min_tokens": 0, "ignore_eos": False, "repetition_penalty": 1.0}
_CLIENT_ERROR_TYPES = {"invalid_request_error", "exceed_context_size_error", "not_found_error"}


def completion_body(request: GenerateRequest, model: str | None, prompt_mode: str, n_ctx: int | None) -> dict:
    """The /v1/completions body for one request; `prompt_mode` is "ids" or "text"."""
    p: SamplingParams = request.params
    if prompt_mode == "text":
        if request.prompt_text is None:
            raise InvalidRequest("this server's remote backend takes text prompts; send text", "prompt")
        prompt = request.prompt_text
    else:
        prompt = list(request.prompt_token_ids)
    max_tokens = p.max_tokens
    if max_tokens is None and n_ctx:  # "until the context is full", which the peer would read as its default
        max_tokens = max(1, n_ctx - len(request.prompt_token_ids))
    body: dict = {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True},
                  "return_token_ids": True, "temperature": p.temperature, "top_p": p.top_p}
    if model:
        body["model"] = model
    if request.user and request.user != ANONYMOUS:  # a peer that shares its slots fairly sees whose it is
        body["user"] = request.user
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    for name, default in _EXTRA_DEFAULTS.items():
        if getattr(p, name) != default:
            body[name] = getattr(p, name)
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.stop_token_ids:
        body["stop_token_ids"] = list(p.stop_token_ids)
    if p.presence_penalty:
        body["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty:
        body["frequency_penalty"] = p.frequency_penalty
    if p.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in p.logit_bias.items()}
    if p.logprobs is not None:
        body["logprobs"] = p.logprobs
    if not p.skip_special_tokens:
        body["skip_special_tokens"] = False
    if p.grammar is not None:
        body.update(_grammar_fields(p))
    return body


def _grammar_fields(p: SamplingParams) -> dict:
    """The output constraint in llama-server's fields (which 1bit takes too); a 400 for kinds it lacks."""
    g = p.grammar
    if g.kind == "json_schema":
        return {"json_schema": json.loads(g.text)}
    if g.kind == "json_object":
        return {"json_schema": {"type": "object"}}
    if g.kind == "gbnf":
        return {"grammar": g.text}
    raise InvalidRequest(f"this backend cannot constrain output by {g.kind} (tool_choice required or named)",
                         g.param)


def error_from_body(status: int, raw: bytes | str, started: bool = False) -> RequestError:
    """A peer's error (HTTP status + OpenAI error body) as the client's fault (ContextOverflow,
    InvalidRequest: never retried) or a BackendError."""
    try:
        payload = json.loads(raw) if raw else {}
    except ValueError:
        payload = {}
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        error = {"message": (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw))[:500]}
    message = str(error.get("message") or f"peer answered HTTP {status}")
    kind = error.get("type") or ""
    client_fault = (400 <= status < 500 and status not in (408, 429)) or kind in _CLIENT_ERROR_TYPES
    if client_fault and not started:
        param = error.get("param") if isinstance(error.get("param"), str) else None
        sizes = error.get("n_prompt_tokens"), error.get("n_ctx")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in sizes):
            return ContextOverflow(sizes[0], sizes[1], message, param)
        return InvalidRequest(message, param)
    return BackendError(f"peer error (HTTP {status}): {message}")


async def sse_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """The lines of an SSE body, split at "\n" only. (httpx's aiter_lines also splits at U+2028,
    U+0085 and others, which JSON leaves unescaped inside strings: a model that emits one would cut
    its event in two.)"""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", errors="replace")


@dataclass
class StreamState:
    """What one streamed completion has said so far."""

    request_id: str
    chunks: int = 0
    tokens: int = 0
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int | None = None
    draft_tokens: int = 0  # a speculating peer's `timings` (llama.cpp's and ours)
    accepted_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the peer found in its prefix cache


def _logprobs(choice: dict, token_ids: list[int]) -> list[TokenLogprob] | None:
    """The sampled tokens' logprobs; top alternatives come as strings, not ids, and are left out."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not token_ids:
        return None
    values = lp.get("token_logprobs") or [c.get("logprob") for c in _content_logprobs(lp)]
    if len(values) != len(token_ids):
        return None
    return [TokenLogprob(t, float(v if v is not None else 0.0)) for t, v in zip(token_ids, values)]


def _content_logprobs(lp) -> list[dict]:
    """llama-server's logprobs shape on /v1/completions: {"content": [{"id", "token", "logprob"}, ...]}."""
    content = lp.get("content") if isinstance(lp, dict) else None
    return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else []


def parse_chunk(state: StreamState, payload: dict) -> StepDelta | None:
    """One SSE chunk -> the text delta it carries (or None); remembers finish and usage."""
    if "error" in payload:
        raise error_from_body(500, json.dumps(payload), started=state.chunks > 0)
    timings = payload.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        state.cached_tokens = timings["cache_n"]
    if isinstance(timings, dict) and "draft_n" in timings:
        state.draft_tokens = int(timings.get("draft_n") or 0)
        state.accepted_tokens = int(timings.get("draft_n_accepted") or 0)
    usage = payload.get("usage")
    if isinstance(usage, dict):
        state.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        state.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            state.cached_tokens = details["cached_tokens"]
    choices = payload.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = choice.get("text") or ""
    ids = choice.get("token_ids")
    ids = [int(t) for t in ids] if isinstance(ids, list) else []
    if not ids:  # llama-server sends no token_ids, but its logprobs entries carry each token's id
        content = _content_logprobs(choice.get("logprobs"))
        if content and all(isinstance(c.get("id"), int) for c in content):
            ids = [c["id"] for c in content]
    if choice.get("finish_reason"):
        state.finish_reason = choice["finish_reason"]
    if not text and not ids:
        return None
    state.chunks += 1
    state.tokens += len(ids) if ids else 1  # a peer without ids sends about one token per chunk
    return StepDelta(state.request_id, ids, text, logprobs=_logprobs(choice, ids))


def final_delta(state: StreamState, n_prompt: int) -> StepDelta:
    """The finished delta, sent once the peer said [DONE] after a finish_reason."""
    count = state.completion_tokens if state.completion_tokens is not None else state.tokens
    return StepDelta(state.request_id, [], "", finished=True, finish_reason=state.finish_reason,
                     num_prompt_tokens=state.prompt_tokens or n_prompt, num_output_tokens=count,
                     num_cached_tokens=state.cached_tokens,
                     num_draft_tokens=state.draft_tokens, num_accepted_tokens=state.accepted_tokens)
