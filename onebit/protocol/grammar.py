"""What a request's output must match: a JSON schema, any JSON object, a GBNF or Lark grammar,
or a regular expression. Plain data (it pickles across the worker pipe); the engine compiles it
(`onebit/engine/grammar/`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from onebit.protocol.errors import InvalidRequest

# json_schema: `text` is the schema as JSON; json_object: any JSON object (`text` unused);
# gbnf: llama.cpp's grammar format; lark: llguidance's Lark dialect (may embed %json{...});
# regex: the whole output matches the expression.
GRAMMAR_KINDS = ("json_schema", "json_object", "gbnf", "lark", "regex")
MAX_GRAMMAR_CHARS = 200_000


@dataclass(frozen=True)
class GrammarSpec:
    """One output constraint: `kind` (one of GRAMMAR_KINDS) and its `text`; `param` names the
    request field it came from, for errors."""

    kind: str
    text: str = ""
    param: str = "response_format"

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the compiled grammar (the cache key)."""
        return self.kind, self.text


def check_grammar(spec: GrammarSpec | None) -> None:
    """InvalidRequest unless `spec` is None or a known kind with text of a sane size (a schema must
    be a JSON object); whether the grammar itself compiles is checked when it is compiled."""
    if spec is None:
        return
    if not isinstance(spec, GrammarSpec) or spec.kind not in GRAMMAR_KINDS:
        raise InvalidRequest(f"unknown grammar kind; expected one of {', '.join(GRAMMAR_KINDS)}", "grammar")
    if not isinstance(spec.text, str) or len(spec.text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"the grammar must be a string of at most {MAX_GRAMMAR_CHARS} characters", spec.param)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.text)
        except json.JSONDecodeError:
            raise InvalidRequest("the JSON schema is not valid JSON", spec.param) from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequest("the JSON schema must be an object", spec.param)
    elif spec.kind != "json_object" and not spec.text.strip():
        raise InvalidRequest("the grammar is empty", spec.param)
