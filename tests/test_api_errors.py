"""Bad requests: each gets the right status and an OpenAI-shaped error, and the server keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_utils import SERVER_ARGS, openai_clients, running_server

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
MSG = [{"role": "user", "content": "hi"}]
CHAT, COMP = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """A server that requires an API key and has a small body limit."""
    with running_server(tiny_model_dir, *SERVER_ARGS, "--api-key", KEY, "--max-body-bytes", "1M") as s:
        yield s


def chat(**fields):
    """A chat body with defaults overridden by `fields` (None removes a field)."""
    body = {"model": "tiny", "messages": MSG, "max_tokens": 4, **fields}
    return {k: v for k, v in body.items() if v is not None}


# (name, method, path, json body or raw bytes, headers, status, error type, param)
CASES = [
    ("bad json", "POST", CHAT, b'{"messages": [', AUTH, 400, "invalid_request_error", None),
    ("body is a list", "POST", CHAT, [1, 2], AUTH, 400, "invalid_request_error", None),
    ("missing messages", "POST", CHAT, chat(messages=None), AUTH, 400, "invalid_request_error", "messages"),
    ("empty messages", "POST", CHAT, chat(messages=[]), AUTH, 400, "invalid_request_error", "messages"),
    ("messages is a string", "POST", CHAT, chat(messages="hi"), AUTH, 400, "invalid_request_error", "messages"),
    ("bad role", "POST", CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), AUTH, 400,
     "invalid_request_error", "messages.0.role"),
    ("content is a number", "POST", CHAT, chat(messages=[{"role": "user", "content": 5}]), AUTH, 400,
     "invalid_request_error", None),
    ("image part", "POST", CHAT, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     AUTH, 400, "invalid_request_error", None),
    ("negative max_tokens", "POST", CHAT, chat(max_tokens=-1), AUTH, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens not a number", "POST", CHAT, chat(max_tokens="lots"), AUTH, 400, "invalid_request_error",
     "max_tokens"),
    ("negative temperature", "POST", CHAT, chat(temperature=-0.5), AUTH, 400, "invalid_request_error", "temperature"),
    ("top_p above 1", "POST", CHAT, chat(top_p=1.5), AUTH, 400, "invalid_request_error", "top_p"),
    ("n zero", "POST", CHAT, chat(n=0), AUTH, 400, "invalid_request_error", "n"),
    ("presence_penalty out of range", "POST", CHAT, chat(presence_penalty=5), AUTH, 400, "invalid_request_error",
     "presence_penalty"),
    ("top_logprobs too many", "POST", CHAT, chat(logprobs=True, top_logprobs=50), AUTH, 400,
     "invalid_request_error", "top_logprobs"),
    ("logit_bias key not a token", "POST", CHAT, chat(logit_bias={"abc": 1}), AUTH, 400, "invalid_request_error",
     "logit_bias"),
    ("logit_bias value too big", "POST", CHAT, chat(logit_bias={"1": 1000}), AUTH, 400, "invalid_request_error",
     "logit_bias"),
    ("stop is a number", "POST", CHAT, chat(stop=5), AUTH, 400, "invalid_request_error", "stop"),
    ("min_tokens above max_tokens", "POST", CHAT, chat(min_tokens=10, max_tokens=2), AUTH, 400,
     "invalid_request_error", "min_tokens"),
    ("stream with bad params", "POST", CHAT, chat(stream=True, max_tokens=0), AUTH, 400, "invalid_request_error",
     "max_tokens"),
    ("prompt over the context", "POST", CHAT, chat(messages=[{"role": "user", "content": "word " * 400}]), AUTH,
     400, "exceed_context_size_error", None),
    ("missing key", "POST", CHAT, chat(), {}, 401, "authentication_error", None),
    ("wrong key", "POST", CHAT, chat(), {"Authorization": "Bearer nope"}, 401, "authentication_error", None),
    ("wrong key on models", "GET", "/v1/models", None, {"Authorization": "Bearer nope"}, 401,
     "authentication_error", None),
    ("unknown route", "GET", "/v1/nothing", None, AUTH, 404, "not_found_error", None),
    ("wrong method", "GET", CHAT, None, AUTH, 405, "invalid_request_error", None),
    ("huge body", "POST", CHAT, chat(messages=[{"role": "user", "content": "x" * (2 << 20)}]), AUTH, 413,
     "invalid_request_error", None),
    ("token id outside vocab", "POST", COMP, {"prompt": [1, 10**9], "max_tokens": 2}, AUTH, 400,
     "invalid_request_error", "prompt"),
    ("empty prompt", "POST", COMP, {"prompt": "", "max_tokens": 2}, AUTH, 400, "invalid_request_error", "prompt"),
    ("prompt missing", "POST", COMP, {"max_tokens": 2}, AUTH, 400, "invalid_request_error", "prompt"),
    ("echo with logprobs", "POST", COMP, {"prompt": "a", "echo": True, "logprobs": 1}, AUTH, 400, "invalid_request_error",
     "echo"),
    ("completion prompt over context", "POST", COMP, {"prompt": list(range(300))}, AUTH, 400,
     "exceed_context_size_error", None),
    ("detokenize outside vocab", "POST", "/detokenize", {"tokens": [-4]}, AUTH, 400, "invalid_request_error",
     "tokens"),
    # every integer within int64 and within its meaning (issue 17), checked by the one shared validation
    ("top_k 2**64", "POST", CHAT, chat(top_k=2**64), AUTH, 400, "invalid_request_error", "top_k"),
    ("top_k 2**63", "POST", COMP, {"prompt": "a", "top_k": 2**63}, AUTH, 400, "invalid_request_error", "top_k"),
    ("max_tokens 2**63", "POST", CHAT, chat(max_tokens=2**63), AUTH, 400, "invalid_request_error", "max_tokens"),
    ("max_completion_tokens 0", "POST", CHAT, chat(max_completion_tokens=0), AUTH, 400, "invalid_request_error",
     "max_completion_tokens"),
    ("min_tokens 2**63", "POST", CHAT, chat(min_tokens=2**63), AUTH, 400, "invalid_request_error", "min_tokens"),
    ("seed 2**64", "POST", CHAT, chat(seed=2**64), AUTH, 400, "invalid_request_error", "seed"),
    ("n 2**64", "POST", CHAT, chat(n=2**64), AUTH, 400, "invalid_request_error", "n"),
    ("n 17", "POST", COMP, {"prompt": "a", "n": 17}, AUTH, 400, "invalid_request_error", "n"),
    ("top_logprobs 2**64 without logprobs", "POST", CHAT, chat(top_logprobs=2**64), AUTH, 400,
     "invalid_request_error", "top_logprobs"),
    ("completion logprobs 2**64", "POST", COMP, {"prompt": "a", "logprobs": 2**64}, AUTH, 400,
     "invalid_request_error", "logprobs"),
    ("logit_bias key 2**64", "POST", CHAT, chat(logit_bias={str(2**64): 1}), AUTH, 400, "invalid_request_error",
     "logit_bias"),
    ("logit_bias key outside vocab", "POST", COMP, {"prompt": "a", "logit_bias": {"100000": 1}}, AUTH, 400,
     "invalid_request_error", "logit_bias"),
    ("speculative n_max 2**64", "POST", CHAT, chat(speculative={"n_max": 2**64}), AUTH, 400,
     "invalid_request_error", "speculative.n_max"),
    ("temperature NaN", "POST", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', AUTH,
     400, "invalid_request_error", "temperature"),
    ("repetition_penalty Infinity", "POST", CHAT,
     b'{"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": Infinity}', AUTH, 400,
     "invalid_request_error", "repetition_penalty"),
    ("prompt token 2**64", "POST", COMP, {"prompt": [1, 2**64]}, AUTH, 400, "invalid_request_error", "prompt"),
    ("tokenize without content", "POST", "/tokenize", {}, AUTH, 400, "invalid_request_error", "content"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, case):
    name, method, path, body, headers, status, type_, param = case
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    resp = httpx.request(method, server.root + path, headers={"content-type": "application/json", **headers},
                         timeout=30, **kwargs)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["type"] == type_ and error["message"]
    if param is not None:
        assert error["param"] == param
    if type_ == "exceed_context_size_error":
        assert error["n_ctx"] == 256 and error["n_prompt_tokens"] >= 256


def test_still_serving_after_bad_requests(server):
    for case in CASES:  # run them again, back to back, then a good request
        _, method, path, body, headers, *_ = case
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
        httpx.request(method, server.root + path, headers={"content-type": "application/json", **headers}, **kwargs)
    resp = httpx.post(server.root + CHAT, json=chat(), headers=AUTH, timeout=30)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(f"{server.root}/health").status_code == 200


def test_health_is_public_with_a_key(server):
    assert httpx.get(f"{server.root}/health").status_code == 200


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_top_k_2_pow_64_is_a_400_through_the_openai_client(server, endpoint, stream):
    client, _ = openai_clients(server, api_key=KEY)
    with pytest.raises(openai.BadRequestError) as info:
        if endpoint == "chat":
            client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, stream=stream,
                                           extra_body={"top_k": 2**64})
        else:
            client.completions.create(model="tiny", prompt="hi", max_tokens=4, stream=stream,
                                      extra_body={"top_k": 2**64})
    assert info.value.status_code == 400 and info.value.body["param"] == "top_k"
    out = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, temperature=1.0,
                                         extra_body={"top_k": 2**40, "ignore_eos": True})  # capped: still serves
    assert out.usage.completion_tokens == 4 and out.choices[0].finish_reason == "length"
