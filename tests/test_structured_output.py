"""Constrained output through the real server and the openai client: JSON schemas, json_object,
GBNF grammars, and the 400s for bad or conflicting constraints (tiny random-weight model)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest
from server_utils import running_server

ARGS = ("--ctx-size", "1024", "--parallel", "8", "--alias", "tiny")
MESSAGES = [{"role": "user", "content": "describe a person"}]

# Nested objects, arrays, enums, required fields and number bounds; every value is bounded so a
# random model reaches the end of the object quickly.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"enum": ["ann", "bob", "cy"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": -1, "maximum": 1},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3},
        "home": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome"]}, "floor": {"type": "integer", "minimum": 0,
                                                                         "maximum": 9}},
            "required": ["city", "floor"],
            "additionalProperties": False,
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "home", "active"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One server for the module."""
    with running_server(tiny_model_dir, *ARGS) as s:
        yield s


def _schema_format(strict: bool = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": strict}}


def test_twenty_sampled_requests_all_validate(clients):
    async def run():
        client = clients[1]
        calls = [client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=1.0, seed=seed,
                                                max_tokens=400, response_format=_schema_format(seed % 2 == 0))
                 for seed in range(20)]
        return await asyncio.gather(*calls)
    responses = asyncio.run(run())
    outputs = set()
    for resp in responses:
        choice = resp.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        value = json.loads(choice.message.content)
        jsonschema.validate(value, PERSON)
        outputs.add(choice.message.content)
    assert len(outputs) > 1  # different seeds sampled different objects: the schema did not fix one


def test_constrained_output_differs_from_unconstrained(clients):
    client = clients[0]
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, seed=5, max_tokens=40)
    shaped = client.chat.completions.create(model="tiny", messages=MESSAGES, seed=5, max_tokens=400,
                                            response_format=_schema_format())
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.choices[0].message.content)
    jsonschema.validate(json.loads(shaped.choices[0].message.content), PERSON)


def test_streamed_equals_whole_for_the_same_seed(clients):
    client = clients[0]
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, seed=11, max_tokens=400,
                                           response_format=_schema_format())
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, seed=11, max_tokens=400,
                                            response_format=_schema_format(), stream=True)
    text, reasons = "", []
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            reasons.append(c.finish_reason)
    assert text == whole.choices[0].message.content
    assert reasons[-1] == "stop"


def test_llama_server_json_schema_field_on_completions(clients):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 3}},
              "required": ["ok", "n"], "additionalProperties": False}
    for seed in range(3):
        resp = clients[0].completions.create(model="tiny", prompt="answer:", seed=seed, max_tokens=100,
                                             extra_body={"json_schema": schema})
        jsonschema.validate(json.loads(resp.choices[0].text), schema)


def test_gbnf_grammar_field(clients):
    grammar = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
    seen = set()
    for seed in range(6):
        resp = clients[0].chat.completions.create(model="tiny", messages=MESSAGES, seed=seed, max_tokens=20,
                                                  extra_body={"grammar": grammar})
        text = resp.choices[0].message.content
        word, number = text.split(" ")
        assert word in ("yes", "no") and number.isdigit() and len(number) <= 2
        seen.add(text)
    assert len(seen) > 1


def test_json_object_is_an_object_when_it_ends(clients):
    ended = 0
    for seed in range(6):
        resp = clients[0].chat.completions.create(model="tiny", messages=MESSAGES, seed=seed, max_tokens=300,
                                                  response_format={"type": "json_object"})
        text = resp.choices[0].message.content
        assert text.startswith("{")
        if resp.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
            ended += 1
    assert ended >= 1


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "frob"}}}},
     "response_format"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "grammar"),
    ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"store": True}, "store"),
])
def test_bad_constraints_are_400_naming_the_field(clients, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        clients[0].chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=5, extra_body=extra)
    assert info.value.body["param"] == param
    # the server keeps serving
    ok = clients[0].chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_echo_prepends_the_prompt(clients):
    plain = clients[0].completions.create(model="tiny", prompt="hello there", seed=3, max_tokens=5)
    echoed = clients[0].completions.create(model="tiny", prompt="hello there", seed=3, max_tokens=5, echo=True)
    assert echoed.choices[0].text == "hello there" + plain.choices[0].text
    stream = clients[0].completions.create(model="tiny", prompt="hello there", seed=3, max_tokens=5, echo=True,
                                           stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == echoed.choices[0].text


def test_suffix_without_fim_tokens_is_400(clients):
    with pytest.raises(openai.BadRequestError) as info:
        clients[0].completions.create(model="tiny", prompt="def f(", suffix="    return x", max_tokens=5)
    assert info.value.body["param"] == "suffix"
