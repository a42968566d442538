"""One streamed request against an OpenAI-compatible server, timed and checked.

A request succeeds only when the stream is complete and honest: HTTP 200, no `error` event,
a finish_reason, a usage chunk, `data: [DONE]` at the end, and as many completion tokens as
asked. Anything else is a failure with a `kind` (see FAILURE_KINDS) and a message.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields

import httpx

from onebit.bench.prompts import Prompt

# "client": the client process that ran the request died or hung (see procs.py).
FAILURE_KINDS = ("http", "connection", "timeout", "error_event", "bad_event", "truncated",
                 "no_finish_reason", "no_usage", "short", "client")


@dataclass
class RequestResult:
    """Timings (seconds) and outcome of one request; times are relative to the request's start."""

    index: int
    start: float = 0.0  # seconds since the level began
    ttft: float | None = None
    e2e: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying text
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens the server took from its prefix cache, if it said
    failure: str | None = None  # one of FAILURE_KINDS, None on success
    message: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request completed in full."""
        return self.failure is None

    def to_json(self) -> dict:
        """A plain dict for the JSON report (times rounded to microseconds)."""
        # Not dataclasses.asdict: it deep-copies chunk_times one float at a time.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("start", "ttft", "e2e"):
            if out[key] is not None:
                out[key] = round(out[key], 6)
        out["chunk_times"] = [round(t, 6) for t in self.chunk_times]
        return out

    @classmethod
    def from_json(cls, data: dict) -> RequestResult:
        """The result a `to_json` dict describes."""
        return cls(**data)


def build_payload(prompt: Prompt, endpoint: str, model: str, max_tokens: int, extra: dict | None = None) -> dict:
    """The JSON body: streamed, usage requested, fixed length (ignore_eos + min_tokens), greedy.

    `extra` is merged in last; a key mapped to None is removed (e.g. {"min_tokens": None}).
    """
    body: dict = {"model": model, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True},
                  "ignore_eos": True, "min_tokens": max_tokens, "temperature": 0.0}
    if endpoint == "chat":
        if prompt.text is None:
            raise ValueError("the chat endpoint needs text prompts")
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = list(prompt.token_ids) if prompt.token_ids is not None else prompt.text
    for key, value in (extra or {}).items():
        # null removes a field, for servers that reject the ones they do not know (422).
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def http_client(headers: dict | None, timeout_s: float, connections: int) -> httpx.AsyncClient:
    """The HTTP client a bench process streams with: no connection cap, `connections` kept alive."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits, headers=headers)


def endpoint_path(endpoint: str) -> str:
    """URL path of 'chat' or 'completions', relative to the /v1 base."""
    return "/chat/completions" if endpoint == "chat" else "/completions"


class _StreamState:
    """What the SSE events of one stream said so far."""

    def __init__(self, result: RequestResult, t0: float):
        self.result = result
        self.t0 = t0
        self.done = False
        self.usage_seen = False
        self.error: str | None = None

    def feed(self, data: bytes, now: float) -> None:
        """Take the payload of one `data:` line that arrived `now` seconds after the request was sent."""
        if data == b"[DONE]":
            self.done = True
            return
        event = json.loads(data.decode())  # str, not bytes: json.loads would sniff the encoding
        if not isinstance(event, dict):
            raise ValueError("event is not a JSON object")
        if event.get("error") is not None:
            err = event["error"]
            self.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            return
        text = False
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if choice.get("text") or delta.get("content") or delta.get("reasoning_content") \
                    or delta.get("tool_calls"):
                text = True
            if choice.get("finish_reason"):
                self.result.finish_reason = choice["finish_reason"]
        if text:
            if self.result.ttft is None:
                self.result.ttft = now
            self.result.chunk_times.append(now)
        usage = event.get("usage")
        if usage:
            self.usage_seen = True
            self.result.prompt_tokens = usage.get("prompt_tokens")
            self.result.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.result.cached_tokens = details["cached_tokens"]
        self._timings(event)

    def _timings(self, event: dict) -> None:
        # llama-server reports drafted/accepted tokens in `timings` on its last chunk, and there
        # `cache_n`, the prompt tokens it reused, when its usage has no prompt_tokens_details.
        timings = event.get("timings")
        if not isinstance(timings, dict):
            return
        if "draft_n" in timings:
            self.result.draft_tokens = timings.get("draft_n")
            self.result.accepted_tokens = timings.get("draft_n_accepted")
        if self.result.cached_tokens is None and isinstance(timings.get("cache_n"), int):
            self.result.cached_tokens = timings["cache_n"]


def _classify(state: _StreamState, max_tokens: int) -> tuple[str, str] | None:
    """(kind, message) for a stream that ended, or None when it is a success."""
    r = state.result
    if state.error is not None:
        return "error_event", state.error
    if not state.done:
        return "truncated", "stream ended without data: [DONE]"
    if r.finish_reason is None:
        return "no_finish_reason", "no choice carried a finish_reason"
    if not state.usage_seen or r.completion_tokens is None:
        return "no_usage", "no usage chunk (stream_options.include_usage ignored?)"
    if r.completion_tokens < max_tokens:
        return "short", f"{r.completion_tokens} of {max_tokens} tokens (finish_reason {r.finish_reason})"
    return None


async def _read_events(response: httpx.Response, state: _StreamState) -> None:
    """Feed each `data:` line of the SSE body to `state` until [DONE], an error event, or the end."""
    # Raw chunks split by hand: aiter_lines stacks three more async generators and a text
    # decoder on every network read, a large part of the client's CPU per token.
    chunks = response.aiter_bytes() if response.headers.get("content-encoding") else response.aiter_raw()
    pending = b""
    async for chunk in chunks:
        now = time.perf_counter() - state.t0  # arrival of the network read, for all events in it
        lines = (pending + chunk).split(b"\n") if pending else chunk.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                state.feed(line[5:].strip(), now)
                if state.done or state.error is not None:
                    return
    if pending.startswith(b"data:"):
        state.feed(pending[5:].strip(), time.perf_counter() - state.t0)


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, index: int = 0,
                         headers: dict | None = None) -> RequestResult:
    """POST `body` to `url`, read the SSE stream to its end, and return the timed, classified result.

    Never raises for a failed request (connection refused, reset, timeout, bad JSON): the
    failure is in the result.
    """
    result = RequestResult(index=index)
    t0 = time.perf_counter()
    state = _StreamState(result, t0)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.failure, result.message = "http", f"HTTP {response.status_code}: {text[:500]}"
            else:
                await _read_events(response, state)
    except httpx.TimeoutException as exc:
        result.failure, result.message = "timeout", f"{type(exc).__name__}: {exc}"
    except httpx.HTTPError as exc:
        result.failure, result.message = "connection", f"{type(exc).__name__}: {exc}"
    except (ValueError, AttributeError) as exc:
        result.failure, result.message = "bad_event", f"unreadable event: {exc}"
    result.e2e = time.perf_counter() - t0
    if result.failure is None:
        verdict = _classify(state, body.get("max_tokens", 0))
        if verdict:
            result.failure, result.message = verdict
    return result
