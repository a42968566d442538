"""Chat pairs made from the corpus itself: for a documented top-level function, the request
"Write a Python function ... that/to <first sentence of its docstring>." and, as the answer, the
function's source in a ```python block; rendered exactly as the model's ChatML template renders a
user turn, the generation prompt and the assistant's answer (see `render_pair`)."""

from __future__ import annotations

import ast
import hashlib
import re

MAX_PAIRS_PER_FILE = 16
MIN_LINES, MAX_LINES, MAX_CHARS = 3, 40, 1600
_SENTENCE_END = re.compile(r"\.(\s|$)")


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def first_sentence(docstring: str) -> str | None:
    """The docstring's first sentence (its first paragraph up to the first full stop), or None when
    it is no plain sentence (too short or long, doctest, markup, a section header)."""
    paragraph = docstring.strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    match = _SENTENCE_END.search(text)
    sentence = (text[:match.start()] if match else text).strip()
    words = sentence.split()
    if not 3 <= len(words) <= 30 or len(sentence) > 200:
        return None
    if any(mark in sentence for mark in (">>>", "`", "::", "|", "{", "}", "\\", "TODO", "http")):
        return None
    if not sentence.split()[0].isalpha() or sentence.endswith(":"):
        return None
    return sentence


def request_text(name: str, args: str, sentence: str, variant: int) -> str:
    """The user's request. A docstring in the imperative ("Return the sum ...") reads "to return
    the sum"; one in the third person ("Returns the sum ...") reads "that returns the sum"; every
    other request leaves the signature out, as a person asking would."""
    first, _, rest = sentence.partition(" ")
    verb = first[0].lower() + first[1:] if not first[1:2].isupper() else first  # keep acronyms
    phrase = f"{verb} {rest}".strip()
    third_person = verb.endswith("s") and not verb.endswith("ss")
    link = "that" if third_person else "to"
    if variant % 2 == 0:
        return f"Write a Python function `{name}({args})` {link} {phrase}."
    return f"Write a Python function {link} {phrase}."


def _without_docstring(source: str, node: ast.FunctionDef) -> str | None:
    """The function's source with its docstring lines removed, or None when that is not clean
    (the docstring shares a line with other code, or it is the whole body). Whole lines go, so
    the rest still parses."""
    doc = node.body[0]
    if len(node.body) < 2 or doc.lineno <= node.lineno or node.body[1].lineno <= doc.end_lineno:
        return None
    lines = source.split("\n")
    first, last = doc.lineno - node.lineno, doc.end_lineno - node.lineno
    return "\n".join(lines[:first] + lines[last + 1:])


def shorten_docstrings(text: str) -> str:
    """The source with every multi-line docstring of a function or class cut to a one-line
    docstring holding its first sentence (module docstrings stay). A small model trained on long
    numpy-style docstrings spends a whole short completion inside one; trained on one-liners, it
    writes the code. Text that does not parse, or a docstring sharing a line with code, is kept."""
    if '"""' not in text and "'''" not in text:
        return text
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text
    cuts = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or not node.body:
            continue
        doc = node.body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        if doc.end_lineno == doc.lineno or doc.lineno <= node.lineno:
            continue
        if len(node.body) > 1 and node.body[1].lineno <= doc.end_lineno:
            continue
        summary = (first_sentence(doc.value.value) or "").rstrip(".")
        if not summary or '"' in summary or "\\" in summary:
            continue
        cuts.append((doc.lineno, doc.end_lineno, doc.col_offset, summary))
    if not cuts:
        return text
    lines = text.split("\n")
    for start, end, col, summary in sorted(cuts, reverse=True):
        if lines[start - 1][:col].strip():
            continue
        lines[start - 1:end] = [" " * col + f'"""{summary}."""']
    return "\n".join(lines)


def function_pairs(text: str, label: str) -> list[tuple[str, str]]:
    """(request, answer) pairs for the documented public top-level functions of one file.

    The answer is "```python\\n<source>\\n```", the source with its docstring for half of the
    functions and without it for the other half (chosen by a hash of the label and name).
    Decorated, private, very short or very long functions are left out.
    """
    if "def " not in text or '"""' not in text and "'''" not in text:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    pairs, lines = [], None
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.decorator_list or node.name.startswith("_"):
            continue
        docstring = ast.get_docstring(node)
        sentence = first_sentence(docstring) if docstring else None
        if sentence is None:
            continue
        if not MIN_LINES <= node.end_lineno - node.lineno + 1 <= MAX_LINES:
            continue
        lines = lines or text.split("\n")
        # A top-level def starts at column 0, so its source is whole lines (ast.get_source_segment
        # would split the file again for every function).
        source = "\n".join(lines[node.lineno - 1:node.end_lineno]).rstrip()
        if len(source) > MAX_CHARS:
            continue
        args = ast.unparse(node.args)
        if len(args) > 100:
            continue
        variant = _hash(f"{label}:{node.name}")
        if variant % 4 >= 2:  # half the answers leave the docstring out, the rest keep its first sentence
            source = _without_docstring(source, node) or source
        else:
            source = shorten_docstrings(source)
        answer = f"```python\n{source}\n```"
        pairs.append((request_text(node.name, args, sentence, variant >> 2), answer))
        if len(pairs) >= MAX_PAIRS_PER_FILE:
            break
    return pairs


def render_pair(request: str, answer: str) -> str:
    """The pair as the model's chat template renders it: the user turn, the generation prompt
    (`<|im_start|>assistant\\n`), the answer and `<|im_end|>` (generation stops there)."""
    return f"<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>"


def select_pairs(pairs: list[tuple[str, str, str]], byte_budget: int) -> list[str]:
    """Rendered pairs in a deterministic shuffled order until their text reaches `byte_budget`."""
    chosen, total = [], 0
    for label, request, answer in sorted(pairs, key=lambda p: _hash(p[0] + p[1])):
        if total >= byte_budget:
            break
        text = render_pair(request, answer)
        chosen.append(text)
        total += len(text.encode())
    return chosen
