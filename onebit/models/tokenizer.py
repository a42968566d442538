"""Tokenizer, chat template, streaming detokenizer and stop-string matcher for one model.

`Tokenizer.from_dir` reads the Hugging Face files of a model directory (`tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`). Chat templates are
untrusted input and render in jinja2's immutable sandbox.
"""

from __future__ import annotations

import codecs

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from onebit.models.errors import ChatTemplateError, ModelLoadError

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "ModelLoadError",
    "StopStringMatcher",
    "Tokenizer",
]

# Used when a model ships no template. Plain ChatML, as Qwen and many others use.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_REPLACEMENT = "\ufffd"


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


def _pick_template(value: Any) -> str | None:
    """A chat_template is a string or a list of {name, template}; prefer the "default" one."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


def _tojson(value: Any, indent: int | None = None, **_ignored: Any) -> str:
    # Unlike jinja2's own tojson, keep <, >, & and non-ASCII as they are: the output is a
    # prompt for a model, not HTML.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _normalize_messages(messages: list[dict]) -> list[dict]:
    """Copy messages, turning list-of-parts content into one string; reject non-text parts."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"messages[{i}] must be an object with a 'role'")
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"messages[{i}]: unsupported content part type {kind!r}; only 'text' is supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({**message, "content": content})
    return out


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
        """Load the tokenizer files of a Hugging Face model directory."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"tokenizer.json not found in {path}")
        try:
            tok = tokenizers.Tokenizer.from_file(str(tok_file))
        except Exception as exc:  # the Rust side raises plain Exception for any parse error
            raise ModelLoadError(f"tokenizer.json in {path} is corrupt or unsupported: {exc}") from None
        config = _read_json(path / "tokenizer_config.json") or {}
        gen = _read_json(path / "generation_config.json") or {}
        template = _pick_template(config.get("chat_template"))
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
        byte_of = {ch: b for b, ch in enumerate(_byte_alphabet())}
        added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        table: list[bytes] = []
        for i in range(self.vocab_size):
            if i in added:
                table.append(added[i].encode("utf-8"))
                continue
            piece = self._tok.id_to_token(i)
            if piece is None or any(ch not in byte_of for ch in piece):
                return None
            table.append(bytes(byte_of[ch] for ch in piece))
        return table

    def id_to_token(self, i: int) -> str | None:
        """The vocabulary string of token `i` (byte-level form), None when out of range."""
        return self._tok.id_to_token(i)

    def token_to_id(self, s: str) -> int | None:
        """The id of vocabulary string `s`, None when it is not a single token."""
        return self._tok.token_to_id(s)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            return env.from_string(self.chat_template)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from None

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
            "messages": _normalize_messages(messages),
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        template = self._compiled_template
        try:
            return template.render(**context)
        except ChatTemplateError:
            raise
        except Exception as exc:  # any failure inside an untrusted template is the template's
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None


def _byte_alphabet() -> list[str]:
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


class IncrementalDetokenizer:
    """Turn a stream of generated token ids into text deltas, one call per step.

    Each step decodes only a small window: the tokens already emitted since `prefix_offset`
    give the context (so a BPE/SentencePiece word boundary decodes as it would in the full
    text), the tokens after `read_offset` are the new ones. Text ending in U+FFFD means an
    incomplete UTF-8 sequence and is held back until the next token completes it.
    """

    # Past this many held tokens a trailing U+FFFD cannot be an incomplete character any more
    # (one is at most 4 bytes); give up waiting so the window stays small on garbage output.
    _MAX_HELD = 8

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, context_ids: list[int] | None = None) -> None:
        """`context_ids`: optional last few prompt tokens, for word-boundary context only."""
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._tokens: list[int] = list(context_ids or [])[-4:]
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)
        self._pieces: list[str] = []
        # Byte-level vocabularies: concatenate token bytes through an incremental UTF-8 decoder,
        # which holds an incomplete character back by itself. Same text, no per-token decode call.
        self._bytes = tokenizer.token_bytes
        if self._bytes is not None:
            self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
            self._skipped = tokenizer.special_token_ids if skip_special_tokens else set()

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._tokens[start:end], skip_special_tokens=self._skip)

    def _emit(self, prefix_text: str, new_text: str, end: int) -> str:
        delta = new_text[len(prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, end
        if delta:
            self._pieces.append(delta)
        return delta

    def _step(self, final: bool) -> str:
        end = len(self._tokens)
        if end == self._read_offset:
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, end)
        if final or (len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT)):
            return self._emit(prefix_text, new_text, end)
        if end - self._read_offset > self._MAX_HELD:
            # Emit up to the last token boundary where the text is whole; keep the tail.
            for split in range(end - 1, self._read_offset, -1):
                text = self._decode(self._prefix_offset, split)
                if len(text) > len(prefix_text) and not text.endswith(_REPLACEMENT):
                    return self._emit(prefix_text, text, split)
            split = end - 3  # all garbage: keep only what may still start a character
            return self._emit(prefix_text, self._decode(self._prefix_offset, split), split)
        return ""

    def _add_bytes(self, token_ids: list[int], final: bool) -> str:
        table, n = self._bytes, len(self._bytes)
        raw = b"".join(table[t] for t in token_ids if t not in self._skipped and 0 <= t < n)
        delta = self._utf8.decode(raw, final)
        if delta:
            self._pieces.append(delta)
        return delta

    def add(self, token_ids: list[int]) -> str:
        """Append generated tokens; return the text that became final with them."""
        if self._bytes is not None:
            return self._add_bytes(token_ids, final=False)
        self._tokens.extend(token_ids)
        return self._step(final=False)

    def flush(self) -> str:
        """Return whatever is held back at the end (an invalid trailing sequence as U+FFFD)."""
        if self._bytes is not None:
            return self._add_bytes([], final=True)
        return self._step(final=True)

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""


class StopStringMatcher:
    """Cut a stream of text deltas at the first occurrence of any stop string.

    Text that might be the start of a stop string is held back until the next delta shows
    whether it is; the stop string itself is never emitted.
    """

    def __init__(self, stops: list[str]) -> None:
        """`stops`: the stop strings; empty strings are ignored."""
        self._stops = sorted({s for s in stops if s})
        self._held = ""
        self.stopped = False

    def _held_suffix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop."""
        longest = max((len(s) for s in self._stops), default=0)
        for k in range(min(len(text), longest - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add a delta; return (text safe to emit now, whether a stop string was reached)."""
        if self.stopped:
            return "", True
        if not self._stops:
            return delta, False
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return text[: min(hits)], True
        keep = self._held_suffix_len(text)
        self._held = text[len(text) - keep:]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """Return the held-back text when the stream ends for another reason."""
        held, self._held = self._held, ""
        return held
