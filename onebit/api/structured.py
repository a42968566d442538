"""Output constraints a request asks for: OpenAI's `response_format` (json_object, json_schema with
`strict`) and llama-server's `json_schema` and `grammar` (GBNF) fields, as one GrammarSpec."""

from __future__ import annotations

import json

from onebit.api.protocol import SamplingFields
from onebit.protocol import InvalidRequest
from onebit.protocol.grammar import GrammarSpec


def _schema_text(schema, param: str) -> str:
    if not isinstance(schema, (dict, bool)):
        raise InvalidRequest("the JSON schema must be an object", param)
    return json.dumps(schema, sort_keys=True, ensure_ascii=False)  # one cache key per schema


def _from_response_format(rf) -> GrammarSpec | None:
    """response_format: {"type": "text" | "json_object" | "json_schema", ...}. A json_schema is
    enforced whole whether `strict` is true or false (strict only promises what is done anyway);
    llama-server's {"type": "json_object", "schema": {...}} is read as a schema too."""
    if not isinstance(rf, dict):
        raise InvalidRequest("response_format must be an object with a type", "response_format")
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is not None:
            return GrammarSpec("json_schema", _schema_text(rf["schema"], "response_format"))
        return GrammarSpec("json_object")
    if kind == "json_schema":
        body = rf.get("json_schema")
        if not isinstance(body, dict) or "schema" not in body and "name" not in body:
            raise InvalidRequest("response_format json_schema needs {\"json_schema\": {\"name\": ..., "
                                 "\"schema\": {...}}}", "response_format")
        strict = body.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidRequest("response_format.json_schema.strict must be a boolean", "response_format")
        schema = body.get("schema", {"type": "object"})
        return GrammarSpec("json_schema", _schema_text(schema, "response_format"))
    raise InvalidRequest('response_format.type must be "text", "json_object" or "json_schema"', "response_format")


def output_grammar(request: SamplingFields) -> GrammarSpec | None:
    """The one output constraint of a request, None for free text; 400 when it asks for two."""
    found = []
    if request.response_format is not None:
        spec = _from_response_format(request.response_format)
        if spec is not None:
            found.append(spec)
    if request.json_schema is not None:
        found.append(GrammarSpec("json_schema", _schema_text(request.json_schema, "json_schema"), "json_schema"))
    if request.grammar is not None:
        if not isinstance(request.grammar, str) or not request.grammar.strip():
            raise InvalidRequest("grammar must be a non-empty GBNF string", "grammar")
        found.append(GrammarSpec("gbnf", request.grammar, "grammar"))
    if len(found) > 1:
        raise InvalidRequest("give at most one of response_format, json_schema and grammar", found[1].param)
    return found[0] if found else None
