"""Tokenizer and chat template for one model.

`Tokenizer.from_dir` reads the Hugging Face files of a model directory (`tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`), or the vocabulary in
a GGUF file's metadata when given one. Chat templates are untrusted input and render in
jinja2's immutable sandbox (chat_template.py); streaming text is detokenizer.py's job.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import tokenizers

from onebit.models.chat_template import (CHATML_TEMPLATE, compile_template, normalize_messages, pick_template,
                                         render_template)
from onebit.models.detokenizer import IncrementalDetokenizer, StopStringMatcher
from onebit.models.errors import ChatTemplateError, ModelLoadError
from onebit.models.safe_prompt import MARK_BASE, escape_messages, split_marked, unescape

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "ModelLoadError",
    "StopStringMatcher",
    "Tokenizer",
]


def _read_json(path: Path) -> dict | None:
    """Return the JSON object in `path`, None when the file is absent; ModelLoadError if bad."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path.name} in {path.parent}: {exc}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path.name} in {path.parent} is not a JSON object")
    return data


def _token_content(value: Any) -> str | None:
    """A special token in tokenizer_config.json is a string or a dict with "content"."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A model's tokenizer (a `tokenizers.Tokenizer`) with its special tokens and chat template."""

    def __init__(
        self,
        tok: tokenizers.Tokenizer,
        *,
        eos_token: str | None = None,
        bos_token: str | None = None,
        extra_eos_token_ids: list[int] | tuple[int, ...] = (),
        chat_template: str | None = None,
    ) -> None:
        """Wrap `tok`; prefer `Tokenizer.from_dir` for a model directory."""
        self._tok = tok
        self.vocab_size: int = tok.get_vocab_size(with_added_tokens=True)
        self.eos_token = eos_token
        self.bos_token = bos_token
        self.bos_token_id: int | None = tok.token_to_id(bos_token) if bos_token else None
        eos_ids = set(extra_eos_token_ids)
        if eos_token is not None and tok.token_to_id(eos_token) is not None:
            eos_ids.add(tok.token_to_id(eos_token))
        self.eos_token_ids: set[int] = eos_ids
        self.special_token_ids: set[int] = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        self.has_chat_template: bool = chat_template is not None
        self.chat_template: str = chat_template if chat_template is not None else CHATML_TEMPLATE

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer files of a Hugging Face model directory (or the vocabulary of a GGUF file)."""
        path = Path(path)
        if path.suffix.lower() == ".gguf":
            from onebit.models.gguf.files import open_gguf
            from onebit.models.gguf.vocab import tokenizer_from_gguf

            return tokenizer_from_gguf(open_gguf(path))
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"tokenizer.json not found in {path}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the Rust side raises plain Exception for any parse error
            raise ModelLoadError(f"tokenizer.json in {path} is corrupt or unsupported: {exc}") from None
        config = _read_json(path / "tokenizer_config.json") or {}
        gen = _read_json(path / "generation_config.json") or {}
        template = pick_template(config.get("chat_template"))
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():  # as in transformers, the separate file wins
            try:
                template = jinja_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ModelLoadError(f"cannot read chat_template.jinja in {path}: {exc}") from None
        eos_ids = gen.get("eos_token_id")
        eos_ids = [eos_ids] if isinstance(eos_ids, int) else eos_ids if isinstance(eos_ids, list) else []
        return cls(
            tok,
            eos_token=_token_content(config.get("eos_token")),
            bos_token=_token_content(config.get("bos_token")),
            extra_eos_token_ids=[i for i in eos_ids if isinstance(i, int)],
            chat_template=template,
        )

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text are recognised as such."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    @cached_property
    def special_tokens(self) -> list[str]:
        """The strings of the special tokens (those only a chat template may write)."""
        return sorted({t.content for t in self._tok.get_added_tokens_decoder().values() if t.special and t.content})

    @cached_property
    def _plain_tok(self) -> tokenizers.Tokenizer:
        tok = tokenizers.Tokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = True  # special-token strings in the text stay text
        return tok

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with special-token strings in it tokenized as ordinary text."""
        return self._plain_tok.encode(text, add_special_tokens=False).ids

    def chat_prompt_ids(self, messages: list[dict], add_generation_prompt: bool = True,
                        tools: list[dict] | None = None, **template_kwargs: Any) -> tuple[str, list[int]]:
        """The rendered chat prompt (as text) and its token ids, where special tokens come only from
        the template: special-token strings inside message content are tokenized as text."""
        specials = self.special_tokens
        marked = self.apply_chat_template(escape_messages(messages, specials), add_generation_prompt, tools,
                                          **template_kwargs)
        ids: list[int] = []
        for piece, is_marker in split_marked(marked, len(specials)):
            if is_marker:
                ids += self.encode_plain(specials[ord(piece) - MARK_BASE])
            else:
                ids += self.encode(piece)
        return unescape(marked, specials), ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; an incomplete UTF-8 sequence decodes to U+FFFD."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @cached_property
    def token_bytes(self) -> list[bytes] | None:
        """For byte-level BPE tokenizers, the raw bytes of every token id (added tokens as UTF-8);
        None for other decoders. Lets detokenization skip the Rust round trip per token."""
        decoder = json.loads(self._tok.to_str()).get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            return None
        alphabet = byte_alphabet()
        # Each alphabet character stands for one byte: translate to the code point of that byte,
        # then latin-1 gives the bytes (one pass in C per token: the whole table in ~0.1 s on a
        # 152k vocabulary, where a per-character loop took 0.6-1.8 s at the first request).
        to_bytes = str.maketrans({ch: chr(b) for b, ch in enumerate(alphabet)})
        added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        pieces: list[str | None] = [None] * self.vocab_size
        for piece, i in self._tok.get_vocab(with_added_tokens=False).items():
            if 0 <= i < self.vocab_size and i not in added:
                pieces[i] = piece
        if any(p is None and i not in added for i, p in enumerate(pieces)):
            return None  # an id with no token: not a plain byte-level vocabulary
        if set("".join(p for p in pieces if p is not None)) - set(alphabet):
            return None  # a character outside the byte alphabet
        return [added[i].encode("utf-8") if p is None else p.translate(to_bytes).encode("latin-1")
                for i, p in enumerate(pieces)]

    def backend_json(self) -> str:
        """The whole tokenizer as `tokenizer.json` text (what grammar libraries load)."""
        return self._tok.to_str()

    def id_to_token(self, i: int) -> str | None:
        """The vocabulary string of token `i` (byte-level form), None when out of range."""
        return self._tok.id_to_token(i)

    def token_to_id(self, s: str) -> int | None:
        """The id of vocabulary string `s`, None when it is not a single token."""
        return self._tok.token_to_id(s)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        return compile_template(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation to the prompt text the model expects (ChatML when it has none).

        Raises ValueError for malformed messages and ChatTemplateError when the template fails.
        """
        context = {
            **template_kwargs,
            "messages": normalize_messages(messages),
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        return render_template(self._compiled_template, context)


def byte_alphabet() -> list[str]:
    """The printable stand-in character for each byte 0..255 in byte-level BPE vocabularies."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in kept:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars

