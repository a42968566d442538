"""The raw SSE body of a stream: whole events in order, every choice's text equal to the same
request unstreamed, one finish per choice, the usage chunk, and exactly one `[DONE]`, last (the
server writes the last delta's chunks, the usage chunk and `[DONE]` together). Also for a reader
that reads slowly, so that one network read holds many events and splits some."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from server_utils import SERVER_ARGS, running_server


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with running_server(tiny_model_dir, *SERVER_ARGS) as s:
        yield s


def _events(body: str) -> list[str]:
    assert body.endswith("\n\n"), body[-200:]
    events = body[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: "):] for e in events]


def _stream(server, path: str, payload: dict, lag_s: float = 0.0) -> list[str]:
    """The events of one streamed request; with `lag_s`, the reader sleeps after every network read."""
    parts = []
    with httpx.stream("POST", f"{server.base_url}{path}", json={**payload, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        for part in response.iter_raw():
            parts.append(part)
            if lag_s:
                time.sleep(lag_s)
    return _events(b"".join(parts).decode())


def _check(events: list[str], n: int, usage: bool, field) -> dict[int, str]:
    """The text of each choice, after checking the stream's shape."""
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    texts = {i: "" for i in range(n)}
    finished: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            assert choice["index"] not in finished, "a chunk after its choice's finish"
            texts[choice["index"]] += field(choice) or ""
            if choice.get("finish_reason"):
                finished[choice["index"]] = choice["finish_reason"]
    assert sorted(finished) == list(range(n))
    if usage:
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
        assert all(c["usage"] is None for c in chunks[:-1])
    else:
        assert all("usage" not in c for c in chunks)
    return texts


@pytest.mark.parametrize("lag_s", [0.0, 0.05], ids=["reader-keeps-up", "slow-reader"])
def test_completions_stream_equals_the_whole_response(server, lag_s):
    payload = {"model": "tiny", "prompt": "The cat sat", "max_tokens": 24, "n": 2, "seed": 5, "temperature": 0.8,
               "ignore_eos": True}
    whole = httpx.post(f"{server.base_url}/completions", json=payload, timeout=60).json()
    events = _stream(server, "/completions", {**payload, "stream_options": {"include_usage": True}}, lag_s)
    texts = _check(events, 2, True, lambda c: c["text"])
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert json.loads(events[-2])["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == 48


@pytest.mark.parametrize("usage", [True, False])
def test_chat_stream_equals_the_whole_response(server, usage):
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "Say something"}], "max_tokens": 16,
               "temperature": 0.0}
    whole = httpx.post(f"{server.base_url}/chat/completions", json=payload, timeout=60).json()
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    events = _stream(server, "/chat/completions", {**payload, **extra})
    texts = _check(events, 1, usage, lambda c: c["delta"].get("content"))
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
    assert texts[0] == whole["choices"][0]["message"]["content"]
