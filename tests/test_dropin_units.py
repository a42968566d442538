"""Unit tests of the drop-in pieces that need no server: built-in chat templates and template files,
the cached-id model name, and a peer's prefix-cache hits read from its stream."""

from __future__ import annotations

import pytest

from onebit.backends.remote_protocol import StreamState, final_delta, parse_chunk
from onebit.cli import main
from onebit.cli_dropin import aliases_of, hf_repo_id
from onebit.models.builtin_templates import BUILTIN_TEMPLATES, chosen_template
from onebit.models.chat_template import compile_template, render_template
from onebit.models.errors import ChatTemplateError

CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"},
        {"role": "user", "content": "V"}]


def render(text: str, add_generation_prompt: bool = True) -> str:
    """A template rendered in the sandbox on CHAT."""
    return render_template(compile_template(text), {"messages": CHAT, "add_generation_prompt": add_generation_prompt,
                                                    "bos_token": "<s>", "eos_token": "</s>"})


def test_builtin_templates_render_their_formats():
    assert set(BUILTIN_TEMPLATES) == {"chatml", "llama3", "mistral"}
    assert render(chosen_template("chatml", None)) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                                                       "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nV"
                                                       "<|im_end|>\n<|im_start|>assistant\n")
    assert render(chosen_template("llama3", None)) == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nV<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render(chosen_template("mistral", None)) == "<s>[INST] S\n\nU [/INST]A</s>[INST] V [/INST]"


def test_template_choices_fail_clearly(tmp_path):
    assert chosen_template(None, None) is None
    with pytest.raises(ValueError, match="built-in templates are chatml, llama3, mistral"):
        chosen_template("vicuna", None)
    with pytest.raises(ValueError, match="choose one"):
        chosen_template("chatml", str(tmp_path / "t.jinja"))
    with pytest.raises(ValueError, match="cannot read"):
        chosen_template(None, str(tmp_path / "missing.jinja"))
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="does not compile"):
        chosen_template(None, str(broken))


def test_a_template_file_is_sandboxed(tmp_path):
    sneaky = tmp_path / "sneaky.jinja"
    sneaky.write_text("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        render(chosen_template(None, str(sneaky)))


def test_bad_template_option_ends_serve_with_a_message(capsys, tiny_model_dir):
    assert main(["serve", "-m", str(tiny_model_dir), "--chat-template", "nope"]) == 1
    assert "--chat-template 'nope'" in capsys.readouterr().err


def test_cached_model_names_andaliases_of(tmp_path):
    snapshot = tmp_path / "models--org--name-v2" / "snapshots" / "abc123"
    assert hf_repo_id(snapshot) == "org/name-v2"
    assert hf_repo_id(tmp_path / "plain-dir") is None
    assert aliases_of(["a", "b,c", " d , "]) == ["a", "b", "c", "d"]
    assert aliases_of(None) == []


def test_peer_cached_tokens_reach_the_final_delta():
    state = StreamState("r")
    parse_chunk(state, {"choices": [{"text": "hi", "finish_reason": "length"}]})
    parse_chunk(state, {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 1,
                                                 "prompt_tokens_details": {"cached_tokens": 32}}})
    assert final_delta(state, 40).num_cached_tokens == 32
    llama = StreamState("s")
    parse_chunk(llama, {"choices": [{"text": "x", "finish_reason": "stop"}], "timings": {"cache_n": 7}})
    assert final_delta(llama, 9).num_cached_tokens == 7


class _FimTokenizer:
    """A stand-in tokenizer with Qwen-style FIM tokens: one id per character, specials above 1000."""

    vocab_size = 1003
    SPECIAL = {"<|fim_prefix|>": 1000, "<|fim_suffix|>": 1001, "<|fim_middle|>": 1002}

    def token_to_id(self, text):
        return self.SPECIAL.get(text)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 1000 for c in text]

    def decode(self, ids, skip_special_tokens=False):
        names = {v: k for k, v in self.SPECIAL.items()}
        return "".join(names.get(i, chr(i)) for i in ids)


def test_infill_prompt_order():
    from types import SimpleNamespace

    from onebit.api.llama_request import InfillRequest, fim_prompt

    state = SimpleNamespace(tokenizer=_FimTokenizer(), n_ctx=512)
    request = InfillRequest(input_prefix="def f(", input_suffix="):", prompt="x",
                            input_extra=[{"filename": "a.py", "text": "y = 1\n"}])
    ids, text = fim_prompt(state, request)
    assert text == "<|fim_prefix|>a.py\ny = 1\ndef f(<|fim_suffix|>):<|fim_middle|>x"
    assert ids[0] == 1000 and ids.count(1001) == 1 and ids.count(1002) == 1
