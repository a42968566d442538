"""Chat templates chosen at start-up (`--chat-template NAME`, `--chat-template-file FILE`) instead of
the one the model ships; written here from each format's documented turn markers."""

from __future__ import annotations

from pathlib import Path

from onebit.models.chat_template import CHATML_TEMPLATE, compile_template
from onebit.models.errors import ChatTemplateError

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Mistral's instruct format: a system message is put before the first user turn.
MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else '' %}"
    "{%- for message in messages if message['role'] != 'system' %}"
    "{%- if message['role'] == 'user' %}"
    "{{- '[INST] ' + (system + '\\n\\n' if system and loop.first else '') + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
)

BUILTIN_TEMPLATES = {"chatml": CHATML_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "mistral": MISTRAL_TEMPLATE}


def chosen_template(name: str | None, file: str | None) -> str | None:
    """The template text for --chat-template NAME or --chat-template-file FILE (None: the model's own);
    ValueError with a clear message for an unknown name, an unreadable file or a template that does
    not compile (it is compiled in the sandbox, as every template is)."""
    if name and file:
        raise ValueError("--chat-template and --chat-template-file are two templates; choose one")
    if name:
        if name not in BUILTIN_TEMPLATES:
            raise ValueError(f"--chat-template {name!r}: built-in templates are {', '.join(BUILTIN_TEMPLATES)}")
        return BUILTIN_TEMPLATES[name]
    if not file:
        return None
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--chat-template-file: cannot read {file}: {error}") from None
    try:
        compile_template(text)
    except ChatTemplateError as error:
        raise ValueError(f"--chat-template-file {file}: {error}") from None
    return text


def with_template(tokenizer, template: str | None):
    """`tokenizer` rendering chats with `template` from now on (unchanged when None)."""
    if template is not None:
        tokenizer.chat_template = template
        tokenizer.has_chat_template = True
    return tokenizer
