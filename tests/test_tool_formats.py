"""Reading tool calls out of generated text, whole and streamed, for each family's format, and the
fill-in-the-middle prompt (unit tests: no server)."""

from __future__ import annotations

import json

import pytest

from onebit.api.fim import fim_prompt
from onebit.api.tool_calls import ToolCallStream
from onebit.models.tokenizer import Tokenizer
from onebit.models.tool_formats import HermesFormat, Llama3Format, MistralFormat, detect_tool_format
from onebit.protocol import InvalidRequest

HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {}}]'


@pytest.mark.parametrize("fmt, text, content, names", [
    (HermesFormat(), HERMES, "Let me check.", ["get_weather", "add"]),
    (Llama3Format(), LLAMA, "", ["get_weather"]),
    (MistralFormat(), MISTRAL, "", ["get_weather", "add"]),
    (HermesFormat(), "no calls here", "no calls here", []),
    (HermesFormat(), "<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
    (Llama3Format(), "{ is a brace", "{ is a brace", []),
])
def test_parse(fmt, text, content, names):
    got_content, calls = fmt.parse(text)
    assert got_content == content
    assert [c.name for c in calls] == names
    for call in calls:
        assert isinstance(json.loads(call.arguments), dict)


def _assemble(pieces) -> list[tuple[str, str]]:
    """(name, arguments) per call index from stream pieces; ids come once, first."""
    calls: dict[int, list] = {}
    for p in pieces:
        if p.id is not None:
            assert p.index not in calls
            calls[p.index] = [p.name, ""]
        calls[p.index][1] += p.arguments
    return [tuple(calls[i]) for i in sorted(calls)]


@pytest.mark.parametrize("fmt, text", [(HermesFormat(), HERMES), (Llama3Format(), LLAMA), (MistralFormat(), MISTRAL),
                                       (HermesFormat(), "plain <tool text"), (Llama3Format(), "  plain")])
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_stream_in_pieces_equals_whole(fmt, text, piece):
    whole = ToolCallStream(fmt)
    whole_content, whole_pieces = whole.feed(text, True)
    stream = ToolCallStream(fmt)
    content, got = "", []
    chunks = [text[i:i + piece] for i in range(0, len(text), piece)]
    for i, chunk in enumerate(chunks):
        c, new = stream.feed(chunk, i == len(chunks) - 1)
        content += c
        got += new
    assert content == whole_content
    assert _assemble(got) == _assemble(whole_pieces) == [(c.name, c.arguments) for _, c in whole.calls]
    assert [c for _, c in stream.calls] == [c for _, c in whole.calls]


def test_hermes_streams_arguments_in_pieces_as_generated():
    stream = ToolCallStream(HermesFormat())
    pieces = []
    for i in range(len(HERMES)):
        pieces += stream.feed(HERMES[i], i == len(HERMES) - 1)[1]
    first = [p for p in pieces if p.index == 0]
    assert first[0].name == "get_weather" and first[0].id.startswith("call_")
    assert len(first) > 5  # the arguments came character by character, not whole
    assert "".join(p.arguments for p in first) == '{"city": "Paris"}'


def test_hermes_stream_closes_each_call_when_its_block_closes():
    stream = ToolCallStream(HermesFormat())
    first_end = HERMES.index("</tool_call>") + len("</tool_call>")
    content, _ = stream.feed(HERMES[:first_end], False)
    assert content == "Let me check.\n" and [c.name for _, c in stream.calls] == ["get_weather"]
    _, pieces = stream.feed(HERMES[first_end:], True)
    assert _assemble(pieces) == [("add", '{"a": 1, "b": 2}')] and {p.index for p in pieces} == {1}


def test_parallel_false_keeps_the_first_call():
    _, pieces = ToolCallStream(MistralFormat(), parallel=False).feed(MISTRAL, True)
    assert _assemble(pieces) == [("get_weather", '{"city": "Paris"}')]


def test_format_is_chosen_from_the_template():
    assert detect_tool_format("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert detect_tool_format("<tool_call>{{ x }}</tool_call>").name == "hermes"
    assert detect_tool_format("<|python_tag|><|eot_id|>").name == "llama3"


def test_fim_prompt_wraps_prefix_and_suffix(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    with pytest.raises(InvalidRequest) as info:
        fim_prompt(tok, [5, 6], "tail")
    assert info.value.param == "suffix"
    tok._tok.add_special_tokens(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    pre, suf, mid = (tok.token_to_id(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    assert fim_prompt(tok, [5, 6], "tail") == [pre, 5, 6, suf, *tok.encode("tail"), mid]
