"""Tokenizer loading, streaming detokenization, stop strings and chat templates."""

from __future__ import annotations

import json
import shutil

import pytest

from onebit.models.tokenizer import (
    ChatTemplateError,
    IncrementalDetokenizer,
    ModelLoadError,
    StopStringMatcher,
    Tokenizer,
)

TEXTS = [
    "Hello, world! How are you today?",
    "def f(x):\n    return x * 2\n",
    "héllo wörld, Grüße aus München",
    "日本語のテキストです。東京",
    "emoji 😀🚀🌍 mixed with text 👍🏽 and flags 🇫🇷🇯🇵",
    "math ∑ xᵢ² ≤ ∞ and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 outside the BMP",
    "  leading spaces\n\n\ttabs and trailing   ",
    "Привет, мир! Γειά σου κόσμε! مرحبا",
]


@pytest.fixture(scope="module", params=["byte-table", "decode-window"])
def tok(tiny_model_dir, request) -> Tokenizer:
    """The tiny tokenizer, once with the byte-level fast path and once forced onto the
    general decode-window path, so both detokenizers pass the same tests."""
    t = Tokenizer.from_dir(tiny_model_dir)
    assert t.token_bytes is not None  # the tiny vocabulary is byte-level BPE
    if request.param == "decode-window":
        t.__dict__["token_bytes"] = None
    return t


def test_byte_table_agrees_with_decode(tiny_model_dir):
    t = Tokenizer.from_dir(tiny_model_dir)
    for i in range(t.vocab_size):
        if i in t.special_token_ids:
            continue
        assert t.token_bytes[i].decode("utf-8", "replace") == t.decode([i]), i


def _copy_with(tmp_path, tiny_model_dir, **config_changes):
    """A copy of the tiny model's tokenizer files with tokenizer_config.json edited."""
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


# --- loading and encode/decode ---------------------------------------------------------------

@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_special_tokens_and_ids(tok, tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert tok.vocab_size == config["vocab_size"]
    im_end, endoftext = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    assert tok.eos_token == "<|im_end|>"
    assert tok.eos_token_ids == {im_end, endoftext}
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok.special_token_ids == {im_end, endoftext, tok.token_to_id("<|im_start|>")}
    assert tok.token_to_id("<think>") not in tok.special_token_ids
    assert tok.id_to_token(im_end) == "<|im_end|>"
    # Special tokens in the text are single tokens, and decode skips them by default.
    ids = tok.encode("hi<|im_end|>")
    assert ids[-1] == im_end
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "hi<|im_end|>"


def test_encode_matches_transformers(tok, tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>"]:
        assert tok.encode(text) == reference(text, add_special_tokens=False)["input_ids"]


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_corrupt_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": [1, 2')
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_corrupt_tokenizer_config(tmp_path, tiny_model_dir):
    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="tokenizer_config.json"):
        Tokenizer.from_dir(tmp_path)


def test_special_tokens_as_dicts_and_int_eos(tmp_path, tiny_model_dir):
    path = _copy_with(tmp_path, tiny_model_dir, eos_token={"content": "<|endoftext|>", "special": True},
                      bos_token={"content": "<|im_start|>"})
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    tok = Tokenizer.from_dir(path)
    assert tok.eos_token == "<|endoftext|>"
    assert tok.eos_token_ids == {7, tok.token_to_id("<|endoftext|>")}
    assert tok.bos_token_id == tok.token_to_id("<|im_start|>")


# --- incremental detokenizer -----------------------------------------------------------------

def _stream(tok, ids, chunk=1, **kwargs):
    detok = IncrementalDetokenizer(tok, **kwargs)
    deltas = [detok.add(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    deltas.append(detok.flush())
    return detok, deltas


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("text", TEXTS)
def test_detokenizer_matches_full_decode(tok, text, chunk):
    ids = tok.encode(text)
    detok, deltas = _stream(tok, ids, chunk)
    assert "".join(deltas) == tok.decode(ids) == text
    assert detok.text == text
    assert not any("\ufffd" in d for d in deltas)


def test_detokenizer_holds_split_multibyte_characters(tok):
    text = TEXTS[4]
    ids = tok.encode(text)
    # The test is only meaningful if some emoji really is split over several tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tok)
    held_once = False
    for i in ids:
        delta = detok.add([i])
        assert "\ufffd" not in delta
        held_once |= delta == "" and "\ufffd" in tok.decode([i])
    assert held_once
    assert detok.flush() == ""
    assert detok.text == text


def test_detokenizer_flushes_invalid_tail_as_replacement(tok):
    lead_byte = tok.token_to_id("æ")  # byte-level form of byte 0xE6, a 3-byte sequence's lead
    detok = IncrementalDetokenizer(tok)
    assert detok.add(tok.encode("ok ")) == "ok "
    assert detok.add([lead_byte]) == ""
    assert detok.flush() == "\ufffd"
    assert detok.text == "ok \ufffd"


def test_detokenizer_gives_up_waiting_on_garbage(tok):
    # A lone continuation byte never completes a character; output must not stall forever
    # (and the window must not grow without bound).
    continuation = tok.token_to_id("Ģ")  # byte-level form of byte 0x80
    assert tok.decode([continuation]) == "\ufffd"
    detok = IncrementalDetokenizer(tok)
    emitted = "".join(detok.add([continuation]) for _ in range(40))
    assert len(emitted) >= 30 and set(emitted) == {"\ufffd"}
    emitted += detok.flush()
    assert emitted == tok.decode([continuation] * 40) == detok.text


def test_detokenizer_special_tokens(tok):
    ids = tok.encode("yes<|im_end|>")
    assert _stream(tok, ids)[0].text == "yes"
    assert _stream(tok, ids, skip_special_tokens=False)[0].text == "yes<|im_end|>"


# --- stop strings ----------------------------------------------------------------------------

def _run(matcher, deltas):
    out, stopped = [], False
    for d in deltas:
        text, stopped = matcher.feed(d)
        out.append(text)
        if stopped:
            break
    if not stopped:
        out.append(matcher.flush())
    return "".join(out), stopped


def test_stop_spanning_deltas():
    m = StopStringMatcher(["STOP"])
    assert m.feed("abc ST") == ("abc ", False)
    assert m.feed("O") == ("", False)
    assert m.feed("Pxyz") == ("", True)
    assert m.feed("more") == ("", True)


def test_partial_prefix_held_then_released():
    m = StopStringMatcher(["</end>"])
    assert m.feed("a </e") == ("a ", False)
    assert m.feed("x") == ("</ex", False)
    assert m.feed("tail <") == ("tail ", False)
    assert m.flush() == "<"


def test_multiple_stops_earliest_wins():
    assert _run(StopStringMatcher(["world", "lo w"]), ["hel", "lo wor", "ld"]) == ("hel", True)
    assert _run(StopStringMatcher(["\n\n", "User:"]), ["Sure.\n", "User: hi"]) == ("Sure.\n", True)
    assert _run(StopStringMatcher(["xyz", "abc"]), ["no stop here"]) == ("no stop here", False)


def test_stop_at_very_beginning():
    assert StopStringMatcher(["Hi"]).feed("Hi there") == ("", True)
    m = StopStringMatcher(["<|"])
    assert m.feed("<") == ("", False)
    assert m.feed("|x") == ("", True)


def test_no_stops_passes_through():
    m = StopStringMatcher(["", ""])
    assert m.feed("anything") == ("anything", False)
    assert m.flush() == ""


# --- chat templates --------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]


def test_chat_template_chatml(tok):
    assert tok.has_chat_template
    assert tok.apply_chat_template(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(CONVERSATION, add_generation_prompt=False)
    assert no_prompt.endswith("<|im_start|>user\nBye<|im_end|>\n")


def test_chat_template_enable_thinking(tok):
    off = tok.apply_chat_template(CONVERSATION[1:2], enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = tok.apply_chat_template(CONVERSATION[1:2], enable_thinking=True)
    assert on.endswith("<|im_start|>assistant\n")


def test_chat_template_text_parts(tok):
    # Text parts are joined by a blank line, as llama-server joins them.
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    assert "<|im_start|>user\nHel\n\nlo<|im_end|>" in tok.apply_chat_template(parts)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(ValueError, match="image_url"):
        tok.apply_chat_template(image)


def test_chat_template_tools_tojson_keeps_characters(tok):
    tools = [{"type": "function", "function": {"name": "f", "description": "<a & b> é"}}]
    prompt = tok.apply_chat_template(CONVERSATION[1:2], tools=tools)
    assert '"description": "<a & b> é"' in prompt


def test_chat_template_matches_transformers(tok, tiny_model_dir):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for kwargs in ({}, {"enable_thinking": False}):
        expected = reference.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True, **kwargs)
        assert tok.apply_chat_template(CONVERSATION, **kwargs) == expected


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set xs = [] %}{{ xs.append(1) }}",
])
def test_chat_template_sandbox_refuses_attacks(tmp_path, tiny_model_dir, template):
    tok = Tokenizer.from_dir(_copy_with(tmp_path, tiny_model_dir, chat_template=template))
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template(CONVERSATION)


def test_chat_template_raise_exception_and_syntax_error(tmp_path, tiny_model_dir):
    tok = Tokenizer.from_dir(_copy_with(tmp_path, tiny_model_dir, chat_template="{{ raise_exception('roles must alternate') }}"))
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        tok.apply_chat_template(CONVERSATION)
    tok = Tokenizer.from_dir(_copy_with(tmp_path, tiny_model_dir, chat_template="{% for %}"))
    with pytest.raises(ChatTemplateError):
        tok.apply_chat_template(CONVERSATION)


def test_chat_template_fallback_and_sources(tmp_path, tiny_model_dir):
    tok = Tokenizer.from_dir(_copy_with(tmp_path, tiny_model_dir, chat_template=None))
    assert not tok.has_chat_template
    assert tok.apply_chat_template(CONVERSATION[1:2]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

    (tmp_path / "chat_template.jinja").write_text("FILE{{ messages[0].content }}")
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(CONVERSATION) == "FILEYou are terse."
    # As in transformers, the separate file wins over tokenizer_config.json's template.
    tok = Tokenizer.from_dir(_copy_with(tmp_path, tiny_model_dir))
    assert tok.apply_chat_template(CONVERSATION).startswith("FILE")
    (tmp_path / "chat_template.jinja").unlink()

    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT {{ bos_token }}"}]
    tok = Tokenizer.from_dir(_copy_with(tmp_path, tiny_model_dir, chat_template=named, bos_token="<|im_start|>"))
    assert tok.apply_chat_template(CONVERSATION) == "DEFAULT <|im_start|>"


def test_the_output_processor_builds_the_byte_table_before_any_request(tiny_model_dir):
    """The byte table (~0.5 s for a 152k vocabulary on the H200's host) is built when the engine's
    output processor is made, not inside the first request's add_request."""
    from onebit.engine.output_processor import OutputProcessor

    t = Tokenizer.from_dir(tiny_model_dir)
    assert "token_bytes" not in t.__dict__
    OutputProcessor(t, t.eos_token_ids)
    assert t.__dict__["token_bytes"] is not None
