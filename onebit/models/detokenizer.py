"""Streaming detokenizer and stop-string matcher: generated token ids -> text deltas."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onebit.models.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


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
