"""How a model family writes tool calls, chosen from its chat template: where a call starts, how
to read calls out of generated text, and a grammar (llguidance Lark) that forces a call.

Hermes/Qwen: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block per call.
Llama 3.x:   `{"name": ..., "parameters": {...}}`, the whole message (`<|python_tag|>` optional).
Mistral:     `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

_DECODER = json.JSONDecoder()
# Tool calls never hold free whitespace between JSON tokens, so a model cannot stall in it.
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class ParsedCall:
    """One call read from the output: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str


def _call_object(value) -> ParsedCall | None:
    """A {"name", "arguments"|"parameters"} object as a call, else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        return ParsedCall(value["name"], args)
    return ParsedCall(value["name"], json.dumps(args, ensure_ascii=False))


def call_schema(tools: list[dict], args_key: str = "arguments") -> dict:
    """The JSON schema of one call to any of `tools` (OpenAI tool objects)."""
    options = []
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": fn["name"]}, args_key: params},
                        "required": ["name", args_key], "additionalProperties": False})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": _JSON_STYLE}


def _lark_json(schema: dict) -> str:
    return "%json " + json.dumps(schema, ensure_ascii=False)


class ToolFormat:
    """Base: one family's tool-call syntax. `marker` starts a call in the output text."""

    name = ""
    marker = ""

    def parse(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content before the calls, the calls); no calls when the text holds none that parse."""
        raise NotImplementedError

    def find_start(self, text: str, at_start: bool) -> tuple[int, int]:
        """Where a call begins in `text` (-1: nowhere yet) and, when nowhere, how many trailing
        characters might still begin one (held back from a stream). `at_start`: nothing of the
        message was sent yet."""
        at = text.find(self.marker)
        if at >= 0:
            return at, 0
        for n in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if text.endswith(self.marker[:n]):
                return -1, n
        return -1, 0

    def complete(self, text: str) -> bool:
        """Whether `text` (starting at the marker) holds every call it has begun, so that parsing it now
        gives the same calls as parsing the whole output would."""
        raise NotImplementedError

    def open_call(self, text: str) -> tuple[str, str] | None:
        """For a call begun but not closed at the end of `text`: (its name, the part of its arguments
        that is certain so far), once the name is known; None otherwise or where the format cannot
        tell before the call ends."""
        return None

    def grammar(self, tools: list[dict], parallel: bool, token_ref: Callable[[str], str]) -> str:
        """A Lark grammar whose every output is one call (several when `parallel`) to one of `tools`;
        `token_ref` writes a marker as the grammar must (a special token by id)."""
        raise NotImplementedError


class HermesFormat(ToolFormat):
    """Qwen 2.5/3, Hermes and the built-in models: `<tool_call>` JSON `</tool_call>` blocks."""

    name = "hermes"
    marker = "<tool_call>"
    _BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
    # A call as the template teaches it: the name first, then the arguments, then the closing brace.
    _HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')

    def _raw_call(self, body: str) -> ParsedCall | None:
        """A name-first call with its arguments exactly as written (what a stream sent), else None."""
        head = self._HEAD.match(body)
        if head is None:
            return None
        try:
            _, end = _DECODER.raw_decode(body, head.end())
        except json.JSONDecodeError:
            return None
        if body[end:].strip() != "}":
            return None
        return ParsedCall(json.loads(head.group(1)), body[head.end():end])

    def parse(self, text):
        start = text.find(self.marker)
        if start < 0:
            return text, []
        calls = []
        for body in self._BLOCK.findall(text[start:]):
            call = self._raw_call(body)
            if call is None:
                try:
                    call = _call_object(json.loads(body))
                except json.JSONDecodeError:
                    call = None
            if call is None:
                return text, []
            calls.append(call)
        return (text[:start].rstrip(), calls) if calls else (text, [])

    def open_call(self, text):
        start = text.rfind(self.marker)
        if start < 0 or text.find("</tool_call>", start) >= 0:
            return None
        body = text[start + len(self.marker):]
        head = self._HEAD.match(body)
        if head is None:
            return None
        args = body[head.end():]
        try:
            _, end = _DECODER.raw_decode(args)
            return json.loads(head.group(1)), args[:end]  # complete: what follows is the closing brace
        except json.JSONDecodeError:
            return json.loads(head.group(1)), args.rstrip()  # unfinished: all of it is arguments

    def complete(self, text):
        return True  # a closed block never changes and parse() reads closed blocks only

    def grammar(self, tools, parallel, token_ref):
        one = f'{token_ref("<tool_call>")} "\\n" call_json "\\n" {token_ref("</tool_call>")}'
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
        return f"{start}\ncall: {one}\ncall_json: {_lark_json(call_schema(tools))}\n"


class Llama3Format(ToolFormat):
    """Llama 3.1-3.3 JSON tool calls: the message is `{"name": ..., "parameters": {...}}`."""

    name = "llama3"
    marker = "{"
    _TAG = "<|python_tag|>"

    def parse(self, text):
        body = text.strip()
        if body.startswith(self._TAG):
            body = body[len(self._TAG):].lstrip()
        calls = []
        while body:
            try:
                value, end = _DECODER.raw_decode(body)
            except json.JSONDecodeError:
                return text, []
            call = _call_object(value)
            if call is None:
                return text, []
            calls.append(call)
            body = body[end:].lstrip().lstrip(";").lstrip()
        return ("", calls) if calls else (text, [])

    def complete(self, text):
        return False  # the message is the call: only its end completes it

    def find_start(self, text, at_start):
        if not at_start:
            return -1, 0
        body = text.lstrip()
        if body.startswith("{") or body.startswith(self._TAG):
            return len(text) - len(body), 0
        if not body or self._TAG.startswith(body):
            return -1, len(text)  # undecided: hold it
        return -1, 0

    def grammar(self, tools, parallel, token_ref):
        start = 'start: call (";" call)*' if parallel else "start: call"
        return f"{start}\ncall: {_lark_json(call_schema(tools, 'parameters'))}\n"


class MistralFormat(ToolFormat):
    """Mistral: `[TOOL_CALLS]` then a JSON array of calls."""

    name = "mistral"
    marker = "[TOOL_CALLS]"

    def parse(self, text):
        start = text.find(self.marker)
        if start < 0:
            return text, []
        try:
            value, _ = _DECODER.raw_decode(text[start + len(self.marker):].lstrip())
        except json.JSONDecodeError:
            return text, []
        items = value if isinstance(value, list) else [value]
        calls = [_call_object(v) for v in items]
        if not calls or any(c is None for c in calls):
            return text, []
        return text[:start].rstrip(), calls

    def complete(self, text):
        return False

    def grammar(self, tools, parallel, token_ref):
        array = {"type": "array", "items": call_schema(tools), "minItems": 1, "x-guidance": _JSON_STYLE}
        if not parallel:
            array["maxItems"] = 1
        return f'start: {token_ref("[TOOL_CALLS]")} calls\ncalls: {_lark_json(array)}\n'


def detect_tool_format(template: str) -> ToolFormat:
    """The tool-call format a chat template teaches its model (Hermes when it shows none)."""
    if "[TOOL_CALLS]" in template:
        return MistralFormat()
    if "<tool_call>" in template:
        return HermesFormat()
    if "<|python_tag|>" in template or ("ipython" in template and "<|eot_id|>" in template):
        return Llama3Format()
    return HermesFormat()
