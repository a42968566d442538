"""Who is asking: API keys (one, or a file of named keys with limits) and the user a request belongs to.

Key file format (`--api-key-file FILE`), one key per line; blank lines and `#` comments are skipped:

    KEY NAME [max_concurrent=N] [max_queued=N] [tpm=N]

KEY is the bearer token clients send, NAME the user it stands for (shown in /queue and /metrics),
and the optional limits are that key's: requests running or waiting at once, requests waiting,
and tokens (prompt + completion) per minute. A request's user is its key's name; without keys,
the OpenAI `user` field; else "anonymous".
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from onebit.protocol.fair_queue import ANONYMOUS

LIMIT_NAMES = ("max_concurrent", "max_queued", "tpm")
MAX_USER_CHARS = 64


@dataclass(frozen=True)
class KeyInfo:
    """One API key: the user it stands for and its limits (None: unlimited)."""

    name: str
    max_concurrent: int | None = None
    max_queued: int | None = None
    tpm: int | None = None


def parse_key_line(line: str, where: str) -> tuple[str, KeyInfo] | None:
    """(key, info) from one line of a key file; None for a blank or comment line."""
    words = line.split("#", 1)[0].split()
    if not words:
        return None
    if len(words) < 2:
        raise ValueError(f"{where}: expected 'KEY NAME [max_concurrent=N] [max_queued=N] [tpm=N]'")
    key, name, limits = words[0], words[1], {}
    for word in words[2:]:
        field, _, value = word.partition("=")
        if field not in LIMIT_NAMES or not value.isdigit() or int(value) < 1:
            raise ValueError(f"{where}: {word!r} is not one of {', '.join(n + '=N' for n in LIMIT_NAMES)} "
                             "with N >= 1")
        limits[field] = int(value)
    return key, KeyInfo(name, **limits)


def load_key_file(path: str | Path) -> dict[str, KeyInfo]:
    """Every key of a key file (ValueError naming the line for a malformed one or a repeated key)."""
    keys: dict[str, KeyInfo] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        parsed = parse_key_line(line, f"{Path(path).name} line {number}")
        if parsed is None:
            continue
        key, info = parsed
        if key in keys:
            raise ValueError(f"{Path(path).name} line {number}: this key is listed twice")
        keys[key] = info
    if not keys:
        raise ValueError(f"{Path(path).name}: no keys")
    return keys


def build_keys(api_key: str | None, key_file: str | Path | None) -> dict[str, KeyInfo]:
    """The server's keys: `--api-key` (user "default") and the key file's, or none."""
    keys = load_key_file(key_file) if key_file else {}
    if api_key:
        keys.setdefault(api_key, KeyInfo("default"))
    return keys


def match_key(keys: dict[bytes, KeyInfo], headers: list[tuple[bytes, bytes]]) -> KeyInfo | None:
    """The key these request headers carry (`Authorization: Bearer KEY` or `x-api-key: KEY`), if known."""
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            sent = value[7:].strip()
        elif name == b"x-api-key":
            sent = value.strip()
        else:
            continue
        for key, info in keys.items():  # compare_digest on each: no early exit on a match's prefix
            if hmac.compare_digest(sent, key):
                return info
    return None


def request_user(http: Request, user_field: str | None) -> tuple[str, KeyInfo | None]:
    """The user a request belongs to and its key (None without keys): the key's name, else the
    OpenAI `user` field (cut to 64 characters), else "anonymous"."""
    key: KeyInfo | None = http.scope.get("state", {}).get("api_key")
    if key is not None:
        return key.name, key
    if user_field and user_field.strip():
        return user_field.strip()[:MAX_USER_CHARS], None
    return ANONYMOUS, None
