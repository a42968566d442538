"""Which installed Python packages may feed the corpus: SPDX expressions, classifiers and free-text
licence fields judged permissive or not."""

from __future__ import annotations

import re
from importlib import metadata

_PERMISSIVE_ID = re.compile(
    r"^(MIT(-0|-CMU)?|0BSD|BSD(-\d-Clause(-[A-Za-z]+)*)?|Apache(-2\.0)?|PSF(-2\.0)?|Python-2\.0(\.1)?"
    r"|ISC|Zlib|CC0-1\.0|BSL-1\.0|Unlicense|CNRI-Python|HPND)$", re.IGNORECASE)
_PERMISSIVE_WORDS = re.compile(r"\b(MIT|BSD|Apache|PSF|Python Software Foundation|ISC|zlib)\b", re.IGNORECASE)
_RESTRICTIVE_WORDS = re.compile(r"GPL|MPL|Mozilla|proprietary|commercial|Commons Clause", re.IGNORECASE)


def spdx_is_permissive(expression: str) -> bool:
    """Evaluate an SPDX licence expression: AND needs every side permissive, OR needs one.

    `WITH <exception>` clauses only add permissions, so they are skipped. Anything that does
    not parse counts as not permissive.
    """
    tokens = re.findall(r"[()]|[^\s()]+", expression)
    pos = 0

    def peek() -> str:
        return tokens[pos].upper() if pos < len(tokens) else ""

    def atom() -> bool:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token == "(":
            value = either()
            if peek() != ")":
                raise ValueError("unbalanced parenthesis")
            pos += 1
        else:
            value = bool(_PERMISSIVE_ID.match(token))
        if peek() == "WITH":
            pos += 2
        return value

    def both() -> bool:
        nonlocal pos
        value = atom()
        while peek() == "AND":
            pos += 1
            value = atom() and value
        return value

    def either() -> bool:
        nonlocal pos
        value = both()
        while peek() == "OR":
            pos += 1
            value = both() or value
        return value

    try:
        value = either()
    except (IndexError, ValueError):
        return False
    return value and pos == len(tokens)


def distribution_license(dist: metadata.Distribution) -> tuple[str, bool]:
    """(licence as the metadata states it, whether it is permissive) for one installed package.

    Order of evidence: `License-Expression` (SPDX), then the `License ::` classifiers (all must
    be permissive), then a short free-text `License` field. Long free-text fields (a whole
    licence pasted in) are judged by their first line only.
    """
    meta = dist.metadata
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return expression, spdx_is_permissive(expression)
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::")]
    classifiers = [c for c in classifiers if c != "OSI Approved"]
    if classifiers:
        ok = all(_PERMISSIVE_WORDS.search(c) and not _RESTRICTIVE_WORDS.search(c) for c in classifiers)
        return "; ".join(classifiers), ok
    text = (meta.get("License") or "").strip()
    first = text.splitlines()[0].strip() if text else ""
    if not first or first.upper() == "UNKNOWN":
        return "unknown", False
    ok = bool(_PERMISSIVE_WORDS.search(first)) and not _RESTRICTIVE_WORDS.search(text)
    return first[:80], ok
