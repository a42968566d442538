"""What OpenAI and llama-server clients check, against the real server: routes without /v1, any
model name with one model served, a cached Hugging Face id served under its repository id,
system_fingerprint, the first stream chunk, text parts, prefill, n_predict, /props and /slots,
timings, prefix-cache hits in usage, CORS, and --help."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil

import httpx
import openai
import pytest
from server_utils import running_server

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO_ID = "testorg/tiny-chat"
ORIGIN = "http://allowed.example"
MESSAGES = [{"role": "user", "content": "hello there"}]
FIXED = {"max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """A server of the tiny model found in a local Hugging Face cache as `-m testorg/tiny-chat`."""
    cache = tmp_path_factory.mktemp("hf-cache")
    snapshot = cache / ("models--" + REPO_ID.replace("/", "--")) / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir, snapshot)
    saved = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(cache)  # read when the server starts
    with contextlib.ExitStack() as stack:
        try:
            s = stack.enter_context(running_server(None, "-m", REPO_ID, "--ctx-size", "256", "--parallel", "4",
                                                   "--api-key", KEY, "--cors-origins", ORIGIN))
        finally:
            if saved is None:
                del os.environ["HF_HUB_CACHE"]
            else:
                os.environ["HF_HUB_CACHE"] = saved
        yield s


def client(server, v1: bool = True) -> openai.OpenAI:
    """The official client, on http://host:port/v1 or (v1=False) on http://host:port."""
    return openai.OpenAI(base_url=server.base_url if v1 else server.root, api_key=KEY, max_retries=0, timeout=60)


def post(server, path: str, body: dict) -> httpx.Response:
    """A JSON POST with the key."""
    return httpx.post(server.root + path, json=body, headers=AUTH, timeout=60)


def raw_stream(server, path: str, body: dict) -> list[dict]:
    """The JSON payloads of an SSE stream, in order (the final [DONE] checked and left out)."""
    with httpx.stream("POST", server.root + path, json={**body, "stream": True}, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_openai_client_without_v1_and_hf_repo_id(server):
    bare, v1 = client(server, v1=False), client(server)
    assert [m.id for m in bare.models.list()] == [m.id for m in v1.models.list()] == [REPO_ID]
    chat = bare.chat.completions.create(model=REPO_ID, messages=MESSAGES, **FIXED)
    same = v1.chat.completions.create(model=REPO_ID, messages=MESSAGES, **FIXED)
    assert chat.choices[0].message.content == same.choices[0].message.content
    assert chat.object == "chat.completion" and chat.model == REPO_ID
    text = bare.completions.create(model=REPO_ID, prompt="once upon", **FIXED)
    assert text.object == "text_completion" and text.choices[0].finish_reason in ("stop", "length")
    chunks = list(bare.chat.completions.create(model=REPO_ID, messages=MESSAGES, stream=True, **FIXED))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_any_model_name_is_served_by_the_one_model(server):
    out = client(server).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, **FIXED)
    assert out.model == REPO_ID
    out = client(server, v1=False).completions.create(model="some/other", prompt="x", **FIXED)
    assert out.model == REPO_ID


def test_system_fingerprint_on_responses_and_every_chunk(server):
    c = client(server)
    full = c.chat.completions.create(model="m", messages=MESSAGES, **FIXED)
    text = c.completions.create(model="m", prompt="abc", **FIXED)
    assert full.system_fingerprint and full.system_fingerprint == text.system_fingerprint
    chunks = list(c.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **FIXED))
    chunks += list(c.completions.create(model="m", prompt="abc", stream=True, **FIXED))
    assert {ch.system_fingerprint for ch in chunks} == {full.system_fingerprint}


def test_first_chunk_is_the_role_with_null_content_and_no_empty_content_follows(server):
    events = raw_stream(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6,
                                                        "ignore_eos": True})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert all("role" not in d for d in deltas)
    assert all(d["content"] != "" for d in deltas if "content" in d)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_text_parts_are_joined_by_a_blank_line(server):
    parts = [{"type": "text", "text": "first part"}, {"type": "text", "text": "second part"}]
    prompt = post(server, "/apply-template", {"messages": [{"role": "user", "content": parts}]}).json()["prompt"]
    assert "first part\n\nsecond part" in prompt
    c = client(server)
    as_parts = c.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}], **FIXED)
    as_text = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "first part\n\nsecond part"}],
                                        **FIXED)
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content


def test_a_final_assistant_message_is_continued(server):
    conversation = MESSAGES + [{"role": "assistant", "content": "The answer is"}]
    prefill = post(server, "/apply-template", {"messages": conversation}).json()["prompt"]
    assert prefill.endswith("<|im_start|>assistant\nThe answer is")
    closed = post(server, "/apply-template", {"messages": conversation, "add_generation_prompt": False}).json()
    assert closed["prompt"].endswith("<|im_start|>assistant\nThe answer is<|im_end|>\n")
    opened = post(server, "/apply-template", {"messages": MESSAGES}).json()["prompt"]
    assert opened.endswith("<|im_start|>assistant\n")
    out = client(server).chat.completions.create(model="m", messages=conversation, **FIXED)
    ids = post(server, "/tokenize", {"content": prefill}).json()["tokens"]
    assert out.usage.prompt_tokens == len(ids)


def test_two_trailing_assistant_messages_are_a_400(server):
    conversation = MESSAGES + [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(model="m", messages=conversation, **FIXED)
    assert caught.value.status_code == 400 and caught.value.body["param"] == "messages"
    assert client(server).chat.completions.create(model="m", messages=MESSAGES, **FIXED).choices


def test_n_predict_is_honoured(server):
    c = client(server)
    chat = c.chat.completions.create(model="m", messages=MESSAGES, extra_body={"n_predict": 3, "ignore_eos": True})
    assert chat.usage.completion_tokens == 3 and chat.choices[0].finish_reason == "length"
    text = c.completions.create(model="m", prompt="abc", extra_body={"n_predict": 5, "ignore_eos": True})
    assert text.usage.completion_tokens == 5
    default = c.completions.create(model="m", prompt="abc", extra_body={"ignore_eos": True})
    assert default.usage.completion_tokens == 16  # OpenAI's default max_tokens
    r = post(server, "/v1/completions", {"prompt": "abc", "n_predict": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"


def test_props_and_slots_carry_the_context(server):
    props = httpx.get(server.root + "/props", headers=AUTH).json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 256
    params = settings["params"]
    for key in ("n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty", "n_probs"):
        assert key in params
    assert params["n_predict"] == -1 and params["temperature"] == 1.0
    slots = httpx.get(server.root + "/slots", headers=AUTH).json()
    assert len(slots) == 4 and all(slot["n_ctx"] == 256 for slot in slots)


def _check_timings(timings: dict, usage) -> None:
    for key in ("prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
                "predicted_ms", "predicted_per_token_ms", "predicted_per_second", "cache_n"):
        assert key in timings
    assert timings["predicted_n"] == usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert timings["cache_n"] == usage.prompt_tokens_details.cached_tokens


def test_timings_as_llama_server_reports_them(server):
    c = client(server)
    full = c.chat.completions.create(model="m", messages=MESSAGES, **FIXED)
    _check_timings(full.model_extra["timings"], full.usage)
    chunks = list(c.completions.create(model="m", prompt="abc", stream=True, stream_options={"include_usage": True},
                                       **FIXED))
    assert all("timings" not in ch.model_extra for ch in chunks[:-1])
    _check_timings(chunks[-1].model_extra["timings"], chunks[-1].usage)


def test_cached_tokens_count_prefix_cache_hits(server):
    c = client(server)
    long = [{"role": "user", "content": "a rather long question about caching " * 6 + "number seven"}]
    first = c.chat.completions.create(model="m", messages=long, **FIXED)
    assert first.usage.prompt_tokens > 48 and first.usage.prompt_tokens_details.cached_tokens == 0
    again = c.chat.completions.create(model="m", messages=long, **FIXED)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 16 <= cached < again.usage.prompt_tokens and cached % 16 == 0  # whole KV blocks of 16
    chunks = list(c.chat.completions.create(model="m", messages=long, stream=True,
                                            stream_options={"include_usage": True}, **FIXED))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
    text = c.completions.create(model="m", prompt="zz " * 40, **FIXED)
    assert text.usage.prompt_tokens_details.cached_tokens == 0
    text = c.completions.create(model="m", prompt="zz " * 40, **FIXED)
    assert text.usage.prompt_tokens_details.cached_tokens >= 16


def test_cors_preflight_is_answered_but_never_opens_a_route(server):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(server.root + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    other = httpx.options(server.root + "/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    # a real request from the allowed origin still needs the key; its 401 is readable by the page
    denied = httpx.post(server.root + "/v1/chat/completions", json={"messages": MESSAGES}, headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == ORIGIN
    not_preflight = httpx.options(server.root + "/v1/models", headers={"Origin": ORIGIN})
    assert not_preflight.status_code == 401
    ok = httpx.get(server.root + "/v1/models", headers={**AUTH, "Origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "access-control-allow-origin" not in httpx.get(server.root + "/v1/models", headers=AUTH).headers


def test_help_shows_every_default():
    from onebit.cli import build_parser

    parser = build_parser()
    serve = next(a for a in parser._actions if a.dest == "command").choices["serve"]
    blocks: list[str] = []  # one per option: its line and the indented help lines under it
    inside = False
    for line in serve.format_help().splitlines():
        if re.match(r"^  -", line):
            blocks.append(line)
            inside = True
        elif inside and line.startswith("    "):
            blocks[-1] += " " + line.strip()
        else:
            inside = False
    blocks = [b for b in blocks if not b.lstrip().startswith("-h,")]
    options = [a for a in serve._actions if a.option_strings and a.help != "==SUPPRESS==" and a.dest != "help"]
    assert len(blocks) == len(options) > 30
    assert [b for b in blocks if "(default:" not in b] == []


def test_reasoning_is_split_by_default(server):
    messages = MESSAGES + [{"role": "assistant", "content": "<think>"}]
    out = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "temperature": 0,
                                                "ignore_eos": True}).json()
    assert out["choices"][0]["message"]["reasoning_content"]  # the prompt opened a <think> block


def test_embeddings_need_the_embedding_option(server):
    r = post(server, "/v1/embeddings", {"input": "hello"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "not_supported"
