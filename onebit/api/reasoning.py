"""Split a `<think>...</think>` block out of generated text, incrementally."""

from __future__ import annotations

OPEN_TAG, CLOSE_TAG = "<think>", "</think>"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Feeds text chunks, returns (reasoning, content) pieces; tags split across chunks are held back.

    `in_reasoning=True` starts inside a block, for templates whose prompt already opens `<think>`.
    """

    def __init__(self, in_reasoning: bool = False):
        self.in_reasoning = in_reasoning
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        """Consume a chunk; return the reasoning and content text that is certain so far."""
        if not self._pending and "<" not in text:  # no tag, nor the start of one: all of it is certain
            return (text, "") if self.in_reasoning else ("", text)
        text = self._pending + text
        self._pending = ""
        reasoning, content = [], []
        while text:
            tag = CLOSE_TAG if self.in_reasoning else OPEN_TAG
            out = reasoning if self.in_reasoning else content
            at = text.find(tag)
            if at >= 0:
                out.append(text[:at])
                text = text[at + len(tag):]
                self.in_reasoning = not self.in_reasoning
                continue
            keep = _partial_suffix(text, tag)
            out.append(text[:len(text) - keep])
            self._pending = text[len(text) - keep:]
            break
        return "".join(reasoning), "".join(content)

    def flush(self) -> tuple[str, str]:
        """End of text: whatever was held back is plain text of the current part."""
        pending, self._pending = self._pending, ""
        return (pending, "") if self.in_reasoning else ("", pending)


def prompt_opens_reasoning(prompt: str) -> bool:
    """True when the rendered prompt ends inside an open `<think>` block."""
    tail = prompt.rstrip()
    return tail.endswith(OPEN_TAG)
