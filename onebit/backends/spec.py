"""`--backend` values: which kind of backend, where, with how many slots.

    native                  our engine in a worker process on --device
    native:cpu | native:cuda | native:cuda:N | native:auto
    url:http://host:port    any OpenAI-compatible server (another 1bit, vLLM, llama-server)
    llama-server:PATH       a llama.cpp llama-server binary that 1bit starts, watches and stops

Any of them takes options after `?`: `slots=N` (the requests it may hold at once);
a `url:` also takes `prompt=ids|text` (how the prompt travels: token ids need the
same tokenizer on the peer) and `model=NAME` (default: the peer's first model).
Example: `url:http://gpu-box-2:8000?slots=32&prompt=text`. A `llama-server:` takes `gguf=FILE`
(the model it loads; default: `-m` when that is a GGUF file) and `args=...` (passed through, e.g.
`llama-server:/opt/llama/bin/llama-server?slots=8&args=-ngl 99 -fa on`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

KINDS = ("native", "url", "llama-server")
_OPTIONS = {"native": {"slots"}, "url": {"slots", "prompt", "model"}, "llama-server": {"slots", "gguf", "args"}}


class BackendSpecError(ValueError):
    """A `--backend` value that cannot be used; the message says why."""


@dataclass
class BackendSpec:
    """One parsed `--backend` value."""

    kind: str  # "native", "url" or "llama-server"
    target: str | None = None  # a native backend's device, a url backend's URL, a llama-server's binary
    slots: int | None = None
    options: dict[str, str] = field(default_factory=dict)


def _split_options(text: str) -> tuple[str, dict[str, str]]:
    if "?" not in text:
        return text, {}
    head, _, query = text.partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise BackendSpecError(f"cannot read the options {query!r}; write key=value&key=value") from None
    return head, dict(pairs)


def parse_backend_spec(text: str) -> BackendSpec:
    """Parse one `--backend` value; raise BackendSpecError with a clear message."""
    kind, _, rest = text.strip().partition(":")
    if kind not in KINDS:
        raise BackendSpecError(f"unknown backend {text!r}; use native[:DEVICE], url:http://HOST:PORT "
                               "or llama-server:PATH")
    rest, options = _split_options(rest)
    unknown = set(options) - _OPTIONS[kind]
    if unknown:
        raise BackendSpecError(f"backend {text!r}: unknown option(s) {', '.join(sorted(unknown))}; "
                               f"{kind} takes {', '.join(sorted(_OPTIONS[kind]))}")
    slots = None
    if "slots" in options:
        try:
            slots = int(options.pop("slots"))
        except ValueError:
            slots = 0
        if slots < 1:
            raise BackendSpecError(f"backend {text!r}: slots must be an integer >= 1")
    if kind == "native":
        device = rest or None
        if device is not None and not (device in ("cpu", "cuda", "auto") or
                                       (device.startswith("cuda:") and device[5:].isdigit())):
            raise BackendSpecError(f"backend {text!r}: device must be cpu, cuda, cuda:N or auto")
        return BackendSpec("native", device, slots, options)
    if kind == "llama-server":
        if not rest:
            raise BackendSpecError(f"backend {text!r}: write llama-server:PATH (the llama-server binary)")
        try:
            shlex.split(options.get("args", ""))
        except ValueError as error:
            raise BackendSpecError(f"backend {text!r}: cannot read args: {error}") from None
        return BackendSpec("llama-server", rest, slots, options)
    parts = urlsplit(rest)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BackendSpecError(f"backend {text!r}: write url:http://HOST:PORT")
    try:
        parts.port  # noqa: B018 -- raises on a bad port
    except ValueError:
        raise BackendSpecError(f"backend {text!r}: the port is not a number in 1-65535") from None
    if options.get("prompt", "ids") not in ("ids", "text"):
        raise BackendSpecError(f"backend {text!r}: prompt must be ids or text")
    return BackendSpec("url", rest.rstrip("/"), slots, options)
