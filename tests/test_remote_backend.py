"""`--backend url:...`: proxying to a second 1bit server, plus the spec parser and the wire mapping."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from server_utils import openai_clients, start_server, stop_server

from onebit.backends.base import BackendError, GenerateRequest
from onebit.backends.remote_protocol import StreamState, completion_body, error_from_body, final_delta, parse_chunk
from onebit.backends.spec import BackendSpecError, parse_backend_spec
from onebit.engine.sampling_params import SamplingParams
from onebit.protocol import ContextOverflow, InvalidRequest


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    peer = start_server(tiny_model_dir, "--device", "cpu", "--ctx-size", "256", "--parallel", "4", "--alias", "tiny")
    try:
        proxy = start_server(tiny_model_dir, "--backend", f"url:{peer.root}?slots=3", "--alias", "tiny",
                             "--backend-timeout", "5")
        try:
            yield peer, proxy
        finally:
            stop_server(proxy)
    finally:
        stop_server(peer)


def test_proxy_shows_one_remote_backend_without_a_worker(servers):
    peer, proxy = servers
    backends = httpx.get(f"{proxy.root}/props").json()["backends"]
    assert [(b["kind"], b["capacity"], b["state"], b["url"]) for b in backends] == [("remote", 3, "ready", peer.root)]
    assert backends[0]["n_ctx"] == 256 and proxy.children() == []
    slots = httpx.get(f"{proxy.root}/slots").json()
    assert [(s["backend"], s["id"], s["is_processing"]) for s in slots] == [("remote-0", i, False) for i in range(3)]


def test_greedy_completion_through_the_proxy_matches_the_peer(servers):
    peer, proxy = servers
    body = {"prompt": "the cat", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    direct = httpx.post(f"{peer.base_url}/completions", json=body, timeout=60).json()
    proxied = httpx.post(f"{proxy.base_url}/completions", json=body, timeout=60).json()
    assert proxied["choices"][0]["text"] == direct["choices"][0]["text"]
    assert proxied["usage"] == direct["usage"] and proxied["usage"]["completion_tokens"] == 12


def test_concurrent_streams_and_chat_through_the_proxy(servers):
    _, proxy = servers
    sync, client = openai_clients(proxy)

    async def one(i: int) -> int:
        stream = await client.completions.create(model="tiny", prompt=f"tale {i}", max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    async def go():
        try:
            return await asyncio.gather(*(one(i) for i in range(5)))  # 3 slots: two wait their turn
        finally:
            await client.close()

    assert asyncio.run(go()) == [10] * 5
    chat = sync.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                        extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"


def test_peer_rejection_is_the_clients_400(servers):
    _, proxy = servers
    resp = httpx.post(f"{proxy.base_url}/completions", json={"prompt": "x", "max_tokens": 2, "stop_token_ids": [-5]},
                      timeout=30)
    assert resp.status_code in (200, 400)  # the peer may ignore the field; it must never be a 500
    resp = httpx.post(f"{proxy.base_url}/completions", json={"prompt": "x " * 400, "max_tokens": 2}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["type"] in ("invalid_request_error",
                                                                         "exceed_context_size_error")


def test_peer_gone_marks_the_proxy_down(servers):
    peer, proxy = servers
    stop_server(peer)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and httpx.get(f"{proxy.root}/health").status_code == 200:
        time.sleep(0.1)
    assert httpx.get(f"{proxy.root}/health").status_code == 503
    resp = httpx.post(f"{proxy.base_url}/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert resp.status_code == 503 and resp.json()["error"]["type"] == "unavailable_error"
    assert proxy.proc.poll() is None, "the proxy keeps running, waiting for its peer"


# ---- units -------------------------------------------------------------------------------


def test_backend_specs():
    assert parse_backend_spec("native").target is None
    assert parse_backend_spec("native:cuda:1?slots=8").slots == 8
    spec = parse_backend_spec("url:http://box:8000/?slots=32&prompt=text&model=m")
    assert (spec.kind, spec.target, spec.slots, spec.options) == ("url", "http://box:8000", 32,
                                                                  {"prompt": "text", "model": "m"})
    for bad in ("gpu", "native:tpu", "native:cpu?slots=0", "native:cpu?prompt=ids", "url:box:8000",
                "url:http://box:99999", "url:http://box:1?prompt=bytes", "url:http://box:1?slots=x"):
        with pytest.raises(BackendSpecError):
            parse_backend_spec(bad)


def test_request_body_and_stream_mapping():
    params = SamplingParams(temperature=0, max_tokens=None, top_k=5, stop=["\n"], logit_bias={3: 1.0}, seed=7)
    request = GenerateRequest("r", [1, 2, 3], params, prompt_text="abc")
    body = completion_body(request, "tiny", "ids", n_ctx=100)
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 97 and body["top_k"] == 5
    assert body["logit_bias"] == {"3": 1.0} and body["seed"] == 7 and body["stream"] is True
    assert completion_body(request, None, "text", None)["prompt"] == "abc"
    with pytest.raises(InvalidRequest):
        completion_body(GenerateRequest("r", [1], params), None, "text", None)
    state = StreamState("r")
    delta = parse_chunk(state, {"choices": [{"text": "ab", "token_ids": [4, 5], "finish_reason": None}]})
    assert (delta.token_ids, delta.text, delta.finished) == ([4, 5], "ab", False)
    assert parse_chunk(state, {"choices": [{"text": "", "finish_reason": "length"}]}) is None
    assert parse_chunk(state, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                               "timings": {"draft_n": 6, "draft_n_accepted": 4}}) is None
    final = final_delta(state, 3)
    assert final.finished and final.finish_reason == "length" and final.num_output_tokens == 2
    assert (final.num_draft_tokens, final.num_accepted_tokens) == (6, 4)  # a speculating peer's counts
    with pytest.raises(BackendError):
        parse_chunk(state, {"error": {"message": "boom", "type": "server_error"}})


def test_peer_errors_map_to_rejection_or_failure():
    rejected = error_from_body(400, b'{"error": {"message": "too long", "type": "exceed_context_size_error", '
                                    b'"n_prompt_tokens": 9, "n_ctx": 4}}')
    assert isinstance(rejected, ContextOverflow) and (rejected.n_ctx, rejected.n_prompt_tokens) == (4, 9)
    for status, raw in ((500, b"oops"), (503, b'{"error": {"message": "busy"}}'), (429, b"")):
        error = error_from_body(status, raw)
        assert isinstance(error, BackendError) and not isinstance(error, InvalidRequest)
