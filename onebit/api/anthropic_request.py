"""Anthropic Messages requests (`POST /v1/messages`, `/v1/messages/count_tokens`): their models and
their translation into our chat messages and SamplingParams."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field

from onebit.api.prepare import rendered_prompt, sampling_params
from onebit.api.protocol import ChatMessage, SamplingFields, _Lenient
from onebit.api.state import ServerState
from onebit.protocol import InvalidRequest, SamplingParams


class ContentBlock(_Lenient):
    """One content block; only `text` blocks can be served (a text-only model)."""

    type: str
    text: str | None = None


class AnthropicMessage(_Lenient):
    """One turn: a user or assistant message, its content a string or content blocks."""

    role: Literal["user", "assistant"]
    content: Union[str, list[ContentBlock]]


class CountTokensRequest(_Lenient):
    """POST /v1/messages/count_tokens."""

    model: str | None = None
    messages: list[AnthropicMessage] = Field(..., min_length=1)
    system: Union[str, list[ContentBlock], None] = None
    tools: list[dict[str, Any]] | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None


def _text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content):
        if block.type != "text" or block.text is None:
            raise InvalidRequest(f"content blocks of type {block.type!r} are not supported; only 'text' is",
                                 f"{param}.{i}.type")
        texts.append(block.text)
    return "\n\n".join(texts)


def chat_messages(request: CountTokensRequest) -> list[ChatMessage]:
    """The conversation as chat messages: `system` first, then each turn's text blocks joined."""
    if request.tools:
        raise InvalidRequest("tools are not supported on /v1/messages", "tools")
    out = []
    if request.system:
        out.append(ChatMessage(role="system", content=_text(request.system, "system")))
    for i, message in enumerate(request.messages):
        out.append(ChatMessage(role=message.role, content=_text(message.content, f"messages.{i}.content")))
    return out


def messages_prompt(state: ServerState, request: CountTokensRequest) -> tuple[str, list[int]]:
    """The rendered prompt and its token ids (a final assistant turn is continued, as Anthropic does)."""
    return rendered_prompt(state, chat_messages(request), "messages")


def messages_params(state: ServerState, request: MessagesRequest) -> SamplingParams:
    """SamplingParams from max_tokens, stop_sequences, temperature, top_p and top_k."""
    fields = SamplingFields(max_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p,
                            top_k=request.top_k, stop=request.stop_sequences)
    return sampling_params(state, fields, request.max_tokens, None, {"stop": "stop_sequences"})[0]
