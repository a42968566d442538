"""The tokenizer built from GGUF metadata against `tokenizers` on the source tokenizer.json, and a
SentencePiece vocabulary against a direct implementation of llama.cpp's score-ordered merging."""

from __future__ import annotations

import json
import shutil

import gguf
import pytest
import tokenizers

from onebit.models.errors import ModelLoadError
from onebit.models.gguf.vocab import PRE_TOKENIZERS
from onebit.models.tokenizer import Tokenizer
from tests.gguf_files import write_gguf

STRINGS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x[i] = i * 2; }",
    "naïve café, Größe, Ελληνικά, русский, 日本語のテキスト, عربى",
    "emoji 😀👍🏽 and 🇫🇷 flags, ZWJ 👩‍👩‍👧",
    "   leading spaces, trailing   \t\t\n\n\n   mixed\r\nwhitespace     runs\n",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n</think>",
    "numbers 1234567 3.14159 and 'contractions' we're don't I'LL",
    "",
    " ",
]
SPLITS = {"qwen2": PRE_TOKENIZERS["qwen2"][0], "llama-bpe": PRE_TOKENIZERS["llama-bpe"][0]}


def _with_pre_tokenizer(src, dst, pre: str):
    """A copy of the tiny model whose tokenizer.json splits with the regex llama.cpp names `pre`."""
    shutil.copytree(src, dst)
    if pre == "gpt-2":
        return dst
    data = json.loads((dst / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": SPLITS[pre]}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    if pre == "llama-bpe":
        data["model"]["ignore_merges"] = True
    (dst / "tokenizer.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("pre", ["gpt-2", "qwen2", "llama-bpe"])
def test_bpe_tokenization_equals_the_source_tokenizer_json(pre, tiny_model_dir, tmp_path):
    src = _with_pre_tokenizer(tiny_model_dir, tmp_path / "src", pre)
    ours = Tokenizer.from_dir(write_gguf(src, tmp_path / "m.gguf", pre=pre))
    ref = tokenizers.Tokenizer.from_file(str(src / "tokenizer.json"))
    for text in STRINGS:
        ids = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text) == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == ref.decode(ids, skip_special_tokens=False)
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    assert len(ours.encode(STRINGS[5])) < len(STRINGS[5]) // 3  # the specials are single tokens


def test_specials_bos_eos_and_chat_template(tiny_model_dir, tmp_path):
    ref = Tokenizer.from_dir(tiny_model_dir)
    ours = Tokenizer.from_dir(write_gguf(tiny_model_dir, tmp_path / "m.gguf", add_bos=True))
    assert ours.eos_token == "<|im_end|>" and ours.eos_token_ids == ref.eos_token_ids
    assert ours.special_token_ids == ref.special_token_ids
    assert ours.chat_template == ref.chat_template
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages) == ref.apply_chat_template(messages)
    bos = ours.token_to_id("<|endoftext|>")
    assert ours.encode("hello", add_special_tokens=True) == [bos] + ours.encode("hello")
    plain = Tokenizer.from_dir(write_gguf(tiny_model_dir, tmp_path / "n.gguf", add_bos=False))
    assert plain.encode("hello", add_special_tokens=True) == plain.encode("hello")


def _spm_file(path, tokens, scores, types, add_bos=True):
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    from onebit.models.gguf.files import open_gguf
    return open_gguf(path)


def _spm_reference(text: str, vocab: dict[str, int], scores: list[float]) -> list[int]:
    """llama.cpp's SentencePiece algorithm: '▁'-escaped text, repeatedly merge the adjacent pair whose
    concatenation is in the vocabulary with the highest score (leftmost on ties), bytes for the rest."""
    pieces = list(("\u2581" + text).replace(" ", "\u2581"))
    while True:
        best = None
        for i in range(len(pieces) - 1):
            joined = pieces[i] + pieces[i + 1]
            if joined in vocab and (best is None or scores[vocab[joined]] > scores[vocab[best[1]]]):
                best = (i, joined)
        if best is None:
            break
        pieces[best[0]:best[0] + 2] = [best[1]]
    ids = []
    for piece in pieces:
        ids += [vocab[piece]] if piece in vocab else [vocab[f"<0x{b:02X}>"] for b in piece.encode("utf-8")]
    return ids


def test_sentencepiece_vocabulary_merges_by_score_with_byte_fallback(tmp_path):
    from onebit.models.gguf.vocab import tokenizer_from_gguf

    words = ["\u2581", "t", "h", "e", "c", "a", "s", "\u2581t", "he", "\u2581the", "at", "\u2581c", "\u2581cat",
             "s\u2581", "\u2581a", "as", "ca", "th"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0] * 259 + [-float(i) * 1.5 - (0.25 if w in ("at", "th") else 0.0) for i, w in enumerate(words)]
    tok = tokenizer_from_gguf(_spm_file(tmp_path / "spm.gguf", tokens, scores, types))
    vocab = {t: i for i, t in enumerate(tokens)}
    for text in ["the cat", "the cats as the cat", "chat ü 😀", "a  b", "cathe thecat"]:
        assert tok.encode(text) == _spm_reference(text, vocab, scores), text
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("the", add_special_tokens=True)[0] == 1


def test_unknown_pre_tokenizer_is_a_clear_error(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match=r"unknown pre-tokenizer 'tekken'.*supported: gpt-2"):
        Tokenizer.from_dir(write_gguf(tiny_model_dir, tmp_path / "m.gguf", pre="tekken"))
