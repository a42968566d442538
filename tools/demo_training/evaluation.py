"""The demo model's acceptance checks, shared by the training run (on the exported weights) and
check_server.py (through `1bit serve`): do greedy completions of plain code prompts parse as
Python, does a chat request for a small function get a `def` that parses.

Parse rule, for a completion of prompt P (the text the model wrote, up to its stop token or the
token limit): when generation hit the token limit, its unfinished last line is dropped (the
standard trim); then P + completion "parses whole" when `ast.parse` accepts it; failing that it
"parses to a top-level statement" when a prefix of it that ends just before a line starting at
column 0 parses and is longer than P (the model finished the definition it was asked for and was
cut inside the next one). A prompt counts as parsed when either holds; both counts are reported.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

CODE_PROMPTS = [
    "def fibonacci(n):",
    "class Stack:\n    def __init__(self):",
    "def is_prime(n):",
    "def read_json(path):",
    "import os\n\n\ndef list_files(path):",
]
CHAT_REQUEST = "Write a Python function to add two numbers."
_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n")


@dataclass
class ParseResult:
    """How a piece of code fared under the parse rule (module docstring)."""

    whole: bool
    top_level: bool
    code: str  # the text that parsed (or the trimmed text, when nothing did)

    @property
    def ok(self) -> bool:
        """Parsed whole or up to a top-level statement."""
        return self.whole or self.top_level


def _parses(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def parse_completion(prompt: str, completion: str, finished: bool) -> ParseResult:
    """Apply the parse rule to prompt + completion; `finished`: the model stopped by itself."""
    text = prompt + completion
    if not finished and "\n" in completion:
        text = text[:text.rfind("\n") + 1]
    elif not finished:
        text = prompt  # not one complete line written
    if len(text) > len(prompt) and _parses(text) is not None:
        return ParseResult(True, False, text)
    lines = text.split("\n")
    prompt_lines = prompt.count("\n") + 1
    for cut in range(len(lines) - 1, prompt_lines - 1, -1):
        line = lines[cut]
        if not line or line[0] in " \t#)]}":
            continue
        prefix = "\n".join(lines[:cut]).rstrip() + "\n"
        if len(prefix.rstrip()) > len(prompt.rstrip()) and _parses(prefix) is not None:
            return ParseResult(False, True, prefix)
    return ParseResult(False, False, text)


def chat_code(answer: str) -> tuple[str, bool]:
    """The code in a chat answer and whether it is complete: the first ```-fenced block (complete
    when the fence closes), else everything from the first line starting with `def `."""
    match = _FENCE.search(answer)
    if match:
        body = answer[match.end():]
        end = body.find("```")
        return (body, False) if end < 0 else (body[:end], True)
    start = answer.find("def ")
    while start > 0 and answer[start - 1] != "\n":
        start = answer.find("def ", start + 1)
    return ("", False) if start < 0 else (answer[start:], False)


def chat_has_function(answer: str, finished: bool) -> tuple[bool, str]:
    """Whether a chat answer holds a top-level `def` that parses (parse rule on the extracted code;
    `finished`: the model ended its answer itself). Returns (ok, the code judged)."""
    code, closed = chat_code(answer)
    result = parse_completion("", code, finished or closed)
    tree = _parses(result.code) if result.ok else None
    ok = tree is not None and any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in tree.body)
    return ok, result.code


def table(rows: list[tuple[str, str]]) -> str:
    """A two-column plain-text table (name | value), for the end of a run's output."""
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)} | {value}" for name, value in rows)
