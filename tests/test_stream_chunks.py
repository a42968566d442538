"""Stream chunks of plain text pieces (rendered from a per-choice template) are byte for byte the
chunks the response models give for the same item."""

from __future__ import annotations

import json

import pytest

from onebit.api.formatters import ChatFormatter, CompletionFormatter
from onebit.api.formatting import ChunkWriter, TextPiece
from onebit.api.generation import Choice, TokenCounter
from onebit.protocol import SamplingParams, StepDelta

# Every ASCII control character, quotes, backslashes, slashes, non-ASCII letters, a character
# outside the BMP, the JSON-special line separators, an empty string and the template's own marker.
TEXTS = ["".join(map(chr, range(0, 128))), ' "quoted" \\back\\ /slash/ ', "héllo wörld ß", "日本語のテキスト",
         "emoji 🙂 and 𝄞", "\u2028\u2029", "", "\x00onebit text\x00", "\x7f\x80\x9f\xa0", "\ud7ff\ue000\uffff"]


def _choices(count: int) -> list[Choice]:
    return [Choice(i, [1, 2, 3], SamplingParams(max_tokens=8), f"rid-{i}") for i in range(count)]


def _formatters(choices: list[Choice]) -> dict:
    return {"chat": ChatFormatter(None, "chatcmpl-x", choices, split=False, in_reasoning=False),
            "completions": CompletionFormatter(None, "cmpl-x", choices, n=len(choices), return_token_ids=False)}


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("kind,fields", [("chat", ["content", "reasoning_content"]), ("completions", ["text"])])
def test_text_pieces_equal_model_chunks(kind, fields, include_usage):
    choices = _choices(3)
    fmt = _formatters(choices)[kind]
    out = ChunkWriter(fmt.chunk_type, fmt.rid, fmt.chunk_object, "model/name \"q\"", include_usage, len(choices),
                      TokenCounter(), "fp_1", fmt.text_item)
    for index in (2, 0, 1):
        for field in fields:
            for text in TEXTS:
                fast = out.text(TextPiece(index, field, text))
                assert fast == out.chunk([fmt.text_item(index, field, text)])
                body = json.loads(fast.removeprefix("data: "))
                delta = body["choices"][0] if kind == "completions" else body["choices"][0]["delta"]
                assert delta[field] == text and body["choices"][0]["index"] == index
                assert ("usage" in body) == include_usage


def test_plain_deltas_become_text_pieces_others_stay_models():
    choices = _choices(1)
    chat, completions = _formatters(choices).values()
    delta = StepDelta("rid-0", [5], "abc", num_output_tokens=1)
    assert chat.piece(0, delta) == TextPiece(0, "content", "abc")
    assert completions.piece(0, delta) == TextPiece(0, "text", "abc")
    empty = StepDelta("rid-0", [5], "", num_output_tokens=1)
    assert chat.piece(0, empty) is None and completions.piece(0, empty) is None
    with_ids = CompletionFormatter(None, "cmpl-x", choices, n=1, return_token_ids=True)
    item = with_ids.piece(0, delta)
    assert not isinstance(item, TextPiece) and item.token_ids == [5] and item.text == "abc"
    split = ChatFormatter(None, "chatcmpl-x", choices, split=True, in_reasoning=True)
    assert split.piece(0, StepDelta("rid-0", [5], "why", num_output_tokens=1)) == \
        TextPiece(0, "reasoning_content", "why")
    mixed = split.piece(0, StepDelta("rid-0", [6], "a</think>so", num_output_tokens=2))
    assert not isinstance(mixed, TextPiece) and mixed.delta.reasoning_content == "a" \
        and mixed.delta.content == "so"
    assert split.piece(0, StepDelta("rid-0", [7], " on", num_output_tokens=3)) == TextPiece(0, "content", " on")
