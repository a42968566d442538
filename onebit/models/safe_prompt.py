"""Chat prompts where only the template makes special tokens: special-token strings that a client
writes inside message content are tokenized as plain text.

Before rendering, each special-token string inside a message's text fields is swapped for a
marker (a character of Unicode's private-use plane 15, which no tokenizer or template treats
specially); after rendering, the text is cut at the markers: the template's own text is encoded
as usual (its special tokens recognised), each marker as the literal string it stood for,
encoded as plain text.
"""

from __future__ import annotations

import re
from typing import Any

MARK_BASE = 0xF0000  # Supplementary Private Use Area-A


def _escape(text: str, pattern: re.Pattern, index: dict[str, int]) -> str:
    return pattern.sub(lambda m: chr(MARK_BASE + index[m.group(0)]), text)


def escape_messages(messages: list[dict], specials: list[str]) -> list[dict]:
    """Copies of `messages` whose text fields (content, its text parts, name, reasoning_content)
    have every special-token string replaced by its marker."""
    if not specials:
        return messages
    index = {s: i for i, s in enumerate(specials)}
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return _escape(value, pattern, index)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    out = []
    for message in messages:
        copy = dict(message)
        for key in ("content", "name", "reasoning_content", "tool_calls"):
            if key in copy:
                copy[key] = clean(copy[key])
        out.append(copy)
    return out


def unescape(text: str, specials: list[str]) -> str:
    """The rendered text with every marker back to its special-token string (for display only)."""
    return "".join(specials[ord(ch) - MARK_BASE] if MARK_BASE <= ord(ch) < MARK_BASE + len(specials) else ch
                   for ch in text)


def split_marked(text: str, count: int) -> list[tuple[str, bool]]:
    """`text` as (piece, is_marker) pairs, in order; a marker piece is one marker character."""
    pieces: list[tuple[str, bool]] = []
    start = 0
    for i, ch in enumerate(text):
        if MARK_BASE <= ord(ch) < MARK_BASE + count:
            if i > start:
                pieces.append((text[start:i], False))
            pieces.append((ch, True))
            start = i + 1
    if start < len(text):
        pieces.append((text[start:], False))
    return pieces
