"""OpenAI Responses requests (`POST /v1/responses`): the model and its translation into our chat
messages and SamplingParams. Text input and output only: tools, files and images are a 400."""

from __future__ import annotations

from typing import Any, Union

from onebit.api.prepare import rendered_prompt, sampling_params
from onebit.api.protocol import ChatMessage, SamplingFields, _Lenient
from onebit.api.state import ServerState
from onebit.protocol import InvalidRequest, SamplingParams

TEXT_PARTS = ("input_text", "output_text", "text")
ROLES = ("user", "assistant", "system", "developer")


class ResponsesRequest(_Lenient):
    """POST /v1/responses."""

    model: str | None = None
    input: Union[str, list[dict[str, Any]]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None


def _content(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or a list of text parts", param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"content parts of type {kind!r} are not supported; only text is",
                                 f"{param}.{i}.type")
        texts.append(part["text"])
    return "\n\n".join(texts)


def input_messages(request: ResponsesRequest) -> list[ChatMessage]:
    """`instructions` as the system message, then the input: one user text, or message items."""
    if request.tools:
        raise InvalidRequest("tools are not supported on /v1/responses", "tools")
    out = [ChatMessage(role="system", content=request.instructions)] if request.instructions else []
    if isinstance(request.input, str):
        return out + [ChatMessage(role="user", content=request.input)]
    if not request.input:
        raise InvalidRequest("input is empty", "input")
    for i, item in enumerate(request.input):
        if item.get("type", "message") != "message" or item.get("role") not in ROLES:
            raise InvalidRequest("input items must be messages with role user, assistant, system or developer",
                                 f"input.{i}")
        out.append(ChatMessage(role=item["role"], content=_content(item.get("content"), f"input.{i}.content")))
    return out


def responses_prompt(state: ServerState, request: ResponsesRequest) -> tuple[str, list[int]]:
    """The rendered prompt and its token ids."""
    return rendered_prompt(state, input_messages(request), "input")


def responses_params(state: ServerState, request: ResponsesRequest) -> SamplingParams:
    """SamplingParams from max_output_tokens, temperature and top_p."""
    fields = SamplingFields(max_tokens=request.max_output_tokens, temperature=request.temperature,
                            top_p=request.top_p)
    return sampling_params(state, fields, request.max_output_tokens, None, {"max_tokens": "max_output_tokens"})[0]
