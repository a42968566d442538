"""The tokenizer stored in a GGUF file, as our Tokenizer: for serving a GGUF through llama-server.

The front tokenizes, renders chat templates and checks token ids itself, so a `-m FILE.gguf`
needs the model's tokenizer without a Hugging Face directory. Only byte-level BPE vocabularies
(`tokenizer.ggml.model` "gpt2": Qwen, Llama 3, our tiny models) are rebuilt, with the
pre-tokenizers whose split patterns are known here.
"""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers

from onebit.models.errors import ModelLoadError
from onebit.models.tokenizer import Tokenizer

# llama.cpp's pre-tokenizer name -> the split pattern Hugging Face's tokenizer.json gives it.
SPLIT_PATTERNS = {
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
             r"|\s+(?!\S)|\s+",
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_CONTROL, _USER_DEFINED = 3, 4  # gguf.TokenType values


def _fields(path: Path) -> dict:
    import gguf  # only here: reading a GGUF's metadata

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {error}") from None
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            out[key] = field.contents()
    return out


def _pre_tokenizer(pre: str) -> dict:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    if pre in ("gpt-2", "default"):
        return {**byte_level, "use_regex": True}
    if pre not in SPLIT_PATTERNS:
        raise ModelLoadError(f"the GGUF's pre-tokenizer {pre!r} is not known here (known: gpt-2, "
                             f"{', '.join(sorted(SPLIT_PATTERNS))}); serve a model directory instead")
    split = {"type": "Split", "pattern": {"Regex": SPLIT_PATTERNS[pre]}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, {**byte_level, "use_regex": False}]}


def tokenizer_json(fields: dict) -> dict:
    """A tokenizer.json document equivalent to the GGUF's tokenizer fields."""
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(f"the GGUF's tokenizer is {model!r}; only byte-level BPE ('gpt2') is supported")
    tokens = list(fields["tokenizer.ggml.tokens"])
    types = list(fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == _CONTROL}
             for i, t in enumerate(tokens) if types[i] in (_CONTROL, _USER_DEFINED)]
    merges = [m.split(" ", 1) for m in fields.get("tokenizer.ggml.merges") or []]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(fields.get("tokenizer.ggml.pre") or "gpt-2"), "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def tokenizer_from_gguf(path: str | Path) -> Tokenizer:
    """The GGUF file's tokenizer, special tokens and chat template; ModelLoadError when unsupported."""
    path = Path(path)
    fields = _fields(path)
    if "tokenizer.ggml.tokens" not in fields:
        raise ModelLoadError(f"{path} carries no tokenizer")
    try:
        tok = tokenizers.Tokenizer.from_str(json.dumps(tokenizer_json(fields)))
    except Exception as error:  # the Rust side raises plain Exception
        raise ModelLoadError(f"cannot rebuild the tokenizer of {path}: {error}") from None
    tokens = fields["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        i = fields.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    return Tokenizer(tok, eos_token=token("tokenizer.ggml.eos_token_id"),
                     bos_token=token("tokenizer.ggml.bos_token_id"),
                     chat_template=fields.get("tokenizer.chat_template"))


def is_gguf(path: str | Path) -> bool:
    """True for a file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a model directory or of a GGUF file."""
    return tokenizer_from_gguf(path) if Path(path).is_file() and is_gguf(path) else Tokenizer.from_dir(path)
