"""Output constraints in the body a remote (or llama-server) backend sends: llama-server's
`json_schema` and `grammar` fields, and a 400 for a kind those servers lack."""

from __future__ import annotations

import json

import pytest

from onebit.backends.remote_protocol import completion_body
from onebit.protocol import GenerateRequest, InvalidRequest, SamplingParams
from onebit.protocol.grammar import GrammarSpec


def _body(spec: GrammarSpec) -> dict:
    request = GenerateRequest("r", [1, 2], SamplingParams(grammar=spec), "hi")
    return completion_body(request, None, "ids", 256)


def test_schemas_and_gbnf_travel_in_llama_server_fields():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert _body(GrammarSpec("json_schema", json.dumps(schema)))["json_schema"] == schema
    assert _body(GrammarSpec("json_object"))["json_schema"] == {"type": "object"}
    assert _body(GrammarSpec("gbnf", 'root ::= "x"', "grammar"))["grammar"] == 'root ::= "x"'


def test_a_lark_grammar_is_refused_naming_its_field():
    with pytest.raises(InvalidRequest) as info:
        _body(GrammarSpec("lark", 'start: "x"', "tool_choice"))
    assert info.value.param == "tool_choice"
