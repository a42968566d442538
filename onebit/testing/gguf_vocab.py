"""The tokenizer half of a GGUF file: read a byte-level BPE `tokenizer.json` into llama.cpp's
token list, types, merges and special ids, and write them as `tokenizer.ggml.*` metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf

from onebit.models.config import ModelConfig
from onebit.models.tokenizer import Tokenizer
from onebit.testing.gguf_tensors import GGUFExportError

__all__ = ["Vocab", "read_vocab", "write_tokenizer_metadata"]

# tokenizer.json split regexes of known byte-level BPE tokenizers -> llama.cpp's `tokenizer.ggml.pre`.
_SPLIT_PRE = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+":
        "llama-bpe",
}


@dataclass
class Vocab:
    """What llama.cpp needs to rebuild the tokenizer."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    add_bos: bool
    chat_template: str | None


def _pre_tokenizer(pre: dict | None) -> str:
    """llama.cpp's pre-tokenizer name for a tokenizer.json `pre_tokenizer` section."""
    if not pre:
        raise GGUFExportError("tokenizer.json has no pre_tokenizer; cannot tell llama.cpp how to split text")
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    if pre.get("type") == "Sequence":
        splits = [p for p in pre.get("pretokenizers", []) if p.get("type") == "Split"]
        if len(splits) == 1:
            pattern = splits[0].get("pattern", {}).get("Regex")
            if pattern in _SPLIT_PRE:
                return _SPLIT_PRE[pattern]
    raise GGUFExportError(
        "unrecognised pre-tokenizer in tokenizer.json; pass --tokenizer-pre NAME with llama.cpp's name for it "
        f"(known here: gpt-2, {', '.join(sorted(set(_SPLIT_PRE.values())))})")


def _adds_bos(tok_json: dict, tok_config: dict, bos: str | None) -> bool:
    if isinstance(tok_config.get("add_bos_token"), bool):
        return tok_config["add_bos_token"]
    post = tok_json.get("post_processor") or {}
    steps = post.get("processors", []) if post.get("type") == "Sequence" else [post]
    for step in steps:
        if step.get("type") == "TemplateProcessing":
            first = (step.get("single") or [{}])[0]
            return "SpecialToken" in first and (bos is None or first["SpecialToken"]["id"] == bos)
    return False


def read_vocab(path: Path, cfg: ModelConfig, pre_override: str | None) -> Vocab:
    """The vocabulary of the model directory `path`, padded to the embedding's rows."""
    tok_file = path / "tokenizer.json"
    if not tok_file.is_file():
        raise GGUFExportError(f"tokenizer.json not found in {path}")
    tok_json = json.loads(tok_file.read_text(encoding="utf-8"))
    model = tok_json.get("model") or {}
    decoder = tok_json.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        raise GGUFExportError("only byte-level BPE tokenizers are supported (tokenizer.json model BPE with a "
                              f"ByteLevel decoder); this one is {model.get('type')} / {decoder.get('type')}")
    tok = Tokenizer.from_dir(path)
    tok_config_file = path / "tokenizer_config.json"
    tok_config = json.loads(tok_config_file.read_text(encoding="utf-8")) if tok_config_file.is_file() else {}

    size = max(cfg.vocab_size, tok.vocab_size)
    tokens: list[str | None] = [None] * size
    types = [int(gguf.TokenType.NORMAL)] * size
    for text, i in model["vocab"].items():
        tokens[i] = text
    for added in tok_json.get("added_tokens", []):
        i = added["id"]
        tokens[i] = added["content"]
        # llama.cpp matches user-defined tokens in raw text and never shows control tokens.
        types[i] = int(gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED)
    for i, text in enumerate(tokens):
        if text is None:  # the model's embedding is larger than the tokenizer: padding rows
            tokens[i] = f"[PAD{i}]"
            types[i] = int(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    def token_id(value) -> int | None:
        value = value.get("content") if isinstance(value, dict) else value
        return tok.token_to_id(value) if isinstance(value, str) else None

    raw_config = json.loads((path / "config.json").read_text())
    eos_id = token_id(tok_config.get("eos_token"))
    if eos_id is None and cfg.eos_token_ids:
        eos_id = cfg.eos_token_ids[0]
    bos_id = token_id(tok_config.get("bos_token"))
    if bos_id is None and isinstance(raw_config.get("bos_token_id"), int):
        bos_id = raw_config["bos_token_id"]
    return Vocab(
        tokens=tokens, types=types, merges=merges,
        pre=pre_override or _pre_tokenizer(tok_json.get("pre_tokenizer")),
        bos_id=bos_id, eos_id=eos_id, pad_id=token_id(tok_config.get("pad_token")),
        add_bos=_adds_bos(tok_json, tok_config, tok.bos_token),
        chat_template=tok.chat_template if tok.has_chat_template else None,
    )


def write_tokenizer_metadata(w: gguf.GGUFWriter, vocab: Vocab) -> None:
    """Add the `tokenizer.ggml.*` keys (and the chat template) for `vocab` to `w`."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(vocab.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    if vocab.bos_id is not None:
        w.add_bos_token_id(vocab.bos_id)
    if vocab.eos_id is not None:
        w.add_eos_token_id(vocab.eos_id)
    if vocab.pad_id is not None:
        w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(vocab.add_bos)
    w.add_add_eos_token(False)
    if vocab.chat_template is not None:
        w.add_chat_template(vocab.chat_template)
