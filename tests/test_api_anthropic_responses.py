"""The Anthropic Messages API (with the real `anthropic` client) and OpenAI's Responses API (with
the real `openai` client) against the real server; streams checked event by event. Each answer is
compared with the chat completion of the same conversation (greedy: the same tokens)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from server_utils import running_server

KEY = "sekret"
GREEDY = {"temperature": 0}  # this anthropic client takes no temperature argument: sent as an extra field
SYSTEM = "You answer briefly."
USER = "What is a fox?"
MESSAGE_EVENTS = ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_stop",
                  "message_delta", "message_stop"]
RESPONSE_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                   "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                   "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """A server that requires an API key (the anthropic client sends it as x-api-key)."""
    with running_server(tiny_model_dir, "--ctx-size", "256", "--parallel", "4", "--alias", "tiny",
                        "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def claude(server):
    """The official Anthropic client."""
    return anthropic.Anthropic(base_url=server.root, api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def oai(server):
    """The official OpenAI client."""
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)


def chat_reference(oai, max_tokens: int, messages=None, **extra):
    """The greedy chat completion of the system prompt and user turn."""
    messages = messages or [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    return oai.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, temperature=0,
                                       **extra)


def sse_events(server, path: str, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of every event of a stream, read with plain httpx."""
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", server.root + path, json={**body, "stream": True}, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        blocks = r.read().decode().strip().split("\n\n")
    out = []
    for block in blocks:
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def collapse(names: list[str]) -> list[str]:
    """Event names with runs of the same name collapsed to one."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


def test_messages_create_matches_the_chat_completion(claude, oai):
    ref = chat_reference(oai, 6)
    msg = claude.messages.create(model="claude-whatever", max_tokens=6, system=SYSTEM, extra_body=GREEDY,
                                 messages=[{"role": "user", "content": USER}])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "tiny"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == ref.choices[0].message.content
    assert msg.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[ref.choices[0].finish_reason]
    assert msg.usage.input_tokens == ref.usage.prompt_tokens
    assert msg.usage.output_tokens == ref.usage.completion_tokens


def test_content_blocks_and_count_tokens(claude):
    blocks = [{"type": "text", "text": "What is"}, {"type": "text", "text": "a fox?"}]
    as_blocks = claude.messages.count_tokens(model="tiny", system=[{"type": "text", "text": SYSTEM}],
                                             messages=[{"role": "user", "content": blocks}])
    as_text = claude.messages.count_tokens(model="tiny", system=SYSTEM,
                                           messages=[{"role": "user", "content": "What is\n\na fox?"}])
    assert as_blocks.input_tokens == as_text.input_tokens > 0
    msg = claude.messages.create(model="tiny", max_tokens=2, system=SYSTEM,
                                 messages=[{"role": "user", "content": blocks}])
    assert msg.usage.input_tokens == as_blocks.input_tokens


def test_messages_stream_event_by_event(server, claude):
    body = {"model": "tiny", "max_tokens": 6, "system": SYSTEM, "messages": [{"role": "user", "content": USER}]}
    whole = claude.messages.create(**body, extra_body=GREEDY)
    events = sse_events(server, "/v1/messages", {**body, **GREEDY})
    assert all(name == data["type"] for name, data in events)
    assert collapse([name for name, _ in events]) == MESSAGE_EVENTS
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    deltas = [d for n, d in events if n == "content_block_delta"]
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" and d["delta"]["text"] for d in deltas)
    assert "".join(d["delta"]["text"] for d in deltas) == whole.content[0].text
    final = next(d for n, d in events if n == "message_delta")
    assert final["delta"]["stop_reason"] == whole.stop_reason
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens
    with claude.messages.stream(**body, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert text == whole.content[0].text and message.stop_reason == whole.stop_reason


def test_stop_sequences(claude):
    body = {"model": "tiny", "extra_body": GREEDY, "messages": [{"role": "user", "content": USER}]}
    whole = claude.messages.create(max_tokens=12, **body).content[0].text
    at = next(i for i in range(1, len(whole) - 3) if whole.find(whole[i:i + 3]) == i)
    msg = claude.messages.create(max_tokens=12, stop_sequences=[whole[at:at + 3]], **body)
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == whole[at:at + 3]
    assert msg.content[0].text == whole[:at]


def test_prefill_continues_the_assistant_turn(claude):
    messages = [{"role": "user", "content": USER}, {"role": "assistant", "content": "A fox is"}]
    counted = claude.messages.count_tokens(model="tiny", messages=messages).input_tokens
    opened = claude.messages.count_tokens(model="tiny", messages=messages[:1]).input_tokens
    assert counted > opened
    assert claude.messages.create(model="tiny", max_tokens=2, messages=messages).usage.input_tokens == counted


@pytest.mark.parametrize("body", [
    {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                                   {"role": "assistant", "content": "b"}]},
    {"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]},
])
def test_bad_messages_are_400(claude, body):
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="tiny", **body)


def test_messages_without_max_tokens_are_400(server):
    r = httpx.post(server.root + "/v1/messages", headers={"x-api-key": KEY},
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_messages_need_the_key(server):
    bad = anthropic.Anthropic(base_url=server.root, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])


def test_responses_create_matches_the_chat_completion(server, oai):
    ref = chat_reference(oai, 6)
    out = oai.responses.create(model="tiny", instructions=SYSTEM, input=USER, max_output_tokens=6, temperature=0)
    assert out.object == "response" and out.output_text == ref.choices[0].message.content
    assert out.status == {"length": "incomplete", "stop": "completed"}[ref.choices[0].finish_reason]
    if out.status == "incomplete":
        assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.input_tokens == ref.usage.prompt_tokens
    assert out.usage.output_tokens == ref.usage.completion_tokens
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    items = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": [{"type": "input_text", "text": USER}]}]
    bare = openai.OpenAI(base_url=server.root, api_key=KEY, max_retries=0)
    same = bare.responses.create(model="tiny", input=items, max_output_tokens=6, temperature=0)
    assert same.output_text == out.output_text


def test_responses_stream_event_by_event(oai):
    body = {"model": "tiny", "instructions": SYSTEM, "input": USER, "max_output_tokens": 6, "temperature": 0}
    whole = oai.responses.create(**body)
    events = list(oai.responses.create(stream=True, **body))
    names = [e.type for e in events]
    assert collapse(names) == RESPONSE_EVENTS + [f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert all(deltas) and "".join(deltas) == whole.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


@pytest.mark.parametrize("body", [
    {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {}}]},
    {"input": [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}]},
    {"input": []},
    {"input": "hi", "max_output_tokens": 0},
])
def test_bad_responses_are_400(oai, body):
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model="tiny", **body)
