"""Tools through the real server and the openai client: forced calls (tool_choice required and named)
whose arguments validate against the tool's schema, streamed deltas equal to the whole response,
parallel_tool_calls, tool results in the next prompt, and the built-in model's named call."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from server_utils import openai_clients, running_server

ARGS = ("--ctx-size", "1024", "--parallel", "8", "--alias", "tiny")
MESSAGES = [{"role": "user", "content": "what is the weather in Paris?"}]
WEATHER = {"type": "object",
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7},
                          "unit": {"enum": ["C", "F"]}},
           "required": ["city", "days"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "sum", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One server for the module."""
    with running_server(tiny_model_dir, *ARGS) as s:
        yield s


def _ask(client, **options):
    return client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=200, **options)


def _streamed_calls(client, **options) -> tuple[list[dict], str | None, str]:
    """The tool calls assembled from a stream's deltas, its finish reason and its content."""
    calls: dict[int, dict] = {}
    reason, content = None, ""
    for chunk in _ask(client, stream=True, **options):
        for c in chunk.choices:
            content += c.delta.content or ""
            reason = c.finish_reason or reason
            for d in c.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
                call["id"] = d.id or call["id"]
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
                call["pieces"] += 1
    return [calls[i] for i in sorted(calls)], reason, content


def _ask_many(server, seeds, **options):
    """The same request for each seed, sent together (they share the engine's batches)."""
    options = {"max_tokens": 200, **options}

    async def run():
        async with openai_clients(server)[1] as aclient:
            return await asyncio.gather(*[
                aclient.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, seed=seed, **options)
                for seed in seeds])
    return asyncio.run(run())


def test_required_calls_validate_against_the_tool_schema(server):
    names = set()
    for resp in _ask_many(server, range(8), tool_choice="required", temperature=1.0,
                          parallel_tool_calls=False):
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls, choice.message
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
            names.add(call.function.name)
    assert names == {"get_weather", "add"}  # "required" lets the model pick either tool


def test_parallel_calls_each_validate(server):
    counts = []
    for resp in _ask_many(server, range(3), tool_choice="required", max_tokens=250):
        calls = resp.choices[0].message.tool_calls or []
        counts.append(len(calls))
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert min(counts) >= 1 and max(counts) > 1  # parallel calls allowed: some answers hold several


def test_named_choice_calls_that_function_once_without_parallel(client):
    for seed in range(4):
        resp = _ask(client, tool_choice={"type": "function", "function": {"name": "add"}}, seed=seed,
                    parallel_tool_calls=False)
        calls = resp.choices[0].message.tool_calls
        assert len(calls) == 1 and calls[0].function.name == "add"
        jsonschema.validate(json.loads(calls[0].function.arguments), ADD)
        assert resp.choices[0].message.content is None


def test_streamed_tool_calls_equal_the_whole_response(client):
    for seed in (1, 2, 3):
        whole = _ask(client, tool_choice="required", seed=seed, parallel_tool_calls=False)
        calls, reason, content = _streamed_calls(client, tool_choice="required", seed=seed,
                                                 parallel_tool_calls=False)
        expected = [{"name": c.function.name, "arguments": c.function.arguments}
                    for c in whole.choices[0].message.tool_calls]
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in calls] == expected
        assert all(c["id"].startswith("call_") for c in calls)
        assert all(c["pieces"] > 3 for c in calls)  # arguments stream in pieces as they are generated
        assert reason == whole.choices[0].finish_reason == "tool_calls"
        assert content == ""


def test_tool_choice_none_leaves_tools_out_of_the_prompt(client):
    bare = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    none = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                          max_tokens=2)
    auto = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=2)
    assert none.usage.prompt_tokens == bare.usage.prompt_tokens < auto.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None


def test_tool_results_round_trip_into_the_prompt(server, client):
    first = _ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}}, seed=4)
    call = first.choices[0].message.tool_calls[0]
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    prompt = httpx.post(f"{server.root}/apply-template", json={"messages": history, "tools": TOOLS}).json()["prompt"]
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {call.function.arguments}}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    assert '"name": "add"' in prompt  # the tools themselves
    follow = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=5, seed=1)
    assert follow.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize("options, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
])
def test_bad_tool_requests_are_400(client, options, param):
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, **options)
    assert info.value.body["param"] == param


def test_required_without_tools_and_malformed_tools_are_400(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tool_choice="required", max_tokens=5)
    assert info.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[{"type": "function"}], max_tokens=5)
    assert info.value.body["param"] == "tools"


def test_builtin_model_named_choice_returns_a_parseable_call():
    with running_server(None, "--ctx-size", "512", "--parallel", "2", "--alias", "demo") as server:
        client = openai_clients(server)[0]
        resp = client.chat.completions.create(
            model="demo", messages=MESSAGES, tools=TOOLS, max_tokens=120, seed=0, parallel_tool_calls=False,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert resp.choices[0].finish_reason == "tool_calls"
