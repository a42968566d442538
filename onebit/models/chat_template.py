"""Chat templates: untrusted jinja2 text from a model file, compiled and rendered in the immutable sandbox."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from onebit.models.errors import ChatTemplateError

# Used when a model ships no template. Plain ChatML, as Qwen and many others use.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def pick_template(value: Any) -> str | None:
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


def normalize_messages(messages: list[dict]) -> list[dict]:
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
            content = "\n\n".join(texts)  # as llama-server joins text parts
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts")
        out.append({**message, "content": content})
    return out


def compile_template(text: str) -> jinja2.Template:
    """Compile a chat template in the sandbox, with the helpers templates expect (tojson, raise_exception,
    strftime_now); ChatTemplateError when it does not compile."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(text)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from None


def render_template(template: jinja2.Template, context: dict) -> str:
    """Render with `context`; any failure inside the untrusted template becomes ChatTemplateError."""
    try:
        return template.render(**context)
    except ChatTemplateError:
        raise
    except Exception as exc:  # any failure inside an untrusted template is the template's
        raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None
