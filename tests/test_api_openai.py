"""The official openai client against the real server: chat and completions, sync and async, streams."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_utils import SERVER_ARGS, running_server


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One server for the module."""
    with running_server(tiny_model_dir, *SERVER_ARGS) as s:
        yield s


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
FIXED = {"max_tokens": 6, "seed": 7, "extra_body": {"ignore_eos": True}}


def test_models_lists_the_alias_with_its_context(client):
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny"]
    assert models[0].model_extra["max_model_len"] == 256


def test_health_routes(server):
    assert httpx.get(f"{server.root}/health").json() == {"status": "ok"}
    assert httpx.get(f"{server.root}/v1/health").status_code == 200


def test_chat_non_streaming_usage(client):
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, **FIXED)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 6
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 6


def test_chat_stream_shape_and_usage_match(client):
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, **FIXED)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, logprobs=True,
                                            stream_options={"include_usage": True}, **FIXED)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [c for c in chunks if c.choices]
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    streamed_tokens = sum(len(c.choices[0].logprobs.content) for c in with_choices if c.choices[0].logprobs)
    assert streamed_tokens == chunks[-1].usage.completion_tokens == 6
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_prompt_forms(server, client):
    ids = httpx.post(f"{server.root}/tokenize", json={"content": "hello world"}).json()["tokens"]
    for prompt in ("hello world", ["hello world", "abc"], ids, [ids, ids[:2]]):
        resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, extra_body={"ignore_eos": True})
        n_prompts = 1 if isinstance(prompt, str) or isinstance(prompt[0], int) else len(prompt)
        assert sorted(c.index for c in resp.choices) == list(range(n_prompts))
        assert resp.usage.completion_tokens == 3 * n_prompts


def test_completion_token_ids_equal_text_prompt(server, client):
    ids = httpx.post(f"{server.root}/tokenize", json={"content": "same prompt", "add_special": True}).json()["tokens"]
    a = client.completions.create(model="tiny", prompt="same prompt", max_tokens=5, seed=3)
    b = client.completions.create(model="tiny", prompt=ids, max_tokens=5, seed=3)
    assert a.choices[0].text == b.choices[0].text


def test_n_fans_out_with_consecutive_seeds(client):
    many = client.completions.create(model="tiny", prompt="x", n=3, seed=11, max_tokens=5,
                                     extra_body={"ignore_eos": True})
    assert sorted(c.index for c in many.choices) == [0, 1, 2]
    assert many.usage.completion_tokens == 15
    third = client.completions.create(model="tiny", prompt="x", seed=13, max_tokens=5,
                                      extra_body={"ignore_eos": True})
    assert many.choices[2].text == third.choices[0].text


def test_chat_n_streaming(client):
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, n=2, stream=True, **FIXED)
    finished = {}
    for chunk in stream:
        for choice in chunk.choices:
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
    assert finished == {0: "length", 1: "length"}


def test_logprobs_shapes(client):
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, top_logprobs=3, **FIXED)
    content = resp.choices[0].logprobs.content
    assert len(content) == 6
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    comp = client.completions.create(model="tiny", prompt="hi", logprobs=2, max_tokens=4,
                                     extra_body={"ignore_eos": True})
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4


def test_stop_string_is_not_emitted(client):
    base = client.completions.create(model="tiny", prompt="once", max_tokens=20, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[5:7]
    assert stop.strip(), f"need a visible stop string in {base!r}"
    cut = client.completions.create(model="tiny", prompt="once", max_tokens=20, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text and base.startswith(cut.text)


def test_async_client_stream_and_not(clients):
    async_client = clients[1]

    async def go():
        full = await async_client.completions.create(model="tiny", prompt="async", max_tokens=5, seed=1,
                                                     extra_body={"ignore_eos": True})
        stream = await async_client.completions.create(model="tiny", prompt="async", max_tokens=5, seed=1,
                                                       stream=True, extra_body={"ignore_eos": True})
        text = "".join([c.choices[0].text async for c in stream if c.choices])
        chat = await async_client.chat.completions.create(model="tiny", messages=MESSAGES, **FIXED)
        return full, text, chat

    full, text, chat = asyncio.run(go())
    assert full.choices[0].text == text
    assert chat.usage.completion_tokens == 6


def test_unknown_fields_are_ignored(client):
    resp = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2,
                                          extra_body={"no_such_field": 1, "mirostat": 2})
    assert resp.choices[0].message.content is not None


def test_tokenize_detokenize_apply_template(server):
    root = server.root
    ids = httpx.post(f"{root}/tokenize", json={"content": "héllo wörld"}).json()["tokens"]
    assert httpx.post(f"{root}/detokenize", json={"tokens": ids}).json() == {"content": "héllo wörld"}
    pieces = httpx.post(f"{root}/tokenize", json={"content": "ab", "with_pieces": True}).json()["tokens"]
    assert all({"id", "piece"} <= set(p) for p in pieces)
    prompt = httpx.post(f"{root}/apply-template", json={"messages": MESSAGES}).json()["prompt"]
    assert "hello there" in prompt


def test_slots_props_metrics(server, client):
    client.completions.create(model="tiny", prompt="m", max_tokens=2)
    slots = httpx.get(f"{server.root}/slots").json()
    assert len(slots) == 8 and all({"id", "is_processing", "backend", "n_decoded"} <= set(s) for s in slots)
    props = httpx.get(f"{server.root}/props").json()
    assert props["n_ctx"] == 256 and props["total_slots"] == 8
    assert props["backends"][0]["kind"] == "native" and props["backends"][0]["state"] == "ready"
    text = httpx.get(f"{server.root}/metrics").text
    for name in ("onebit:prompt_tokens_total", "onebit:generation_tokens_total", "onebit:num_requests_running",
                 "onebit:num_requests_waiting", "onebit:time_to_first_token_seconds_bucket",
                 "onebit:inter_token_latency_seconds_bucket", "onebit:e2e_request_latency_seconds_bucket",
                 "onebit:kv_cache_usage_perc", "onebit:num_preemptions", "onebit:request_success_total"):
        assert name in text, name
    assert 'backend="native-0"' in text
