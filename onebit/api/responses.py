"""Response models of the completion endpoints: what the handlers construct and serialize, whole
responses and SSE chunks alike (so /openapi.json describes exactly what is sent)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class _Response(BaseModel):
    """A response model; `dump` leaves out optional fields never set (e.g. `timings` when nothing was
    drafted) and keeps those set to None on purpose (e.g. `"usage": null` on content chunks)."""

    def dump(self) -> str:
        """Compact JSON of the fields that were set."""
        return self.model_dump_json(exclude_unset=True)


class PromptTokensDetails(_Response):
    """`usage.prompt_tokens_details`: prompt tokens served from the prefix cache."""

    cached_tokens: int


class Usage(_Response):
    """Token counts of one response."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class Timings(_Response):
    """llama.cpp's `timings`: prompt tokens evaluated (`prompt_n`, the cached ones in `cache_n`) and
    tokens generated (`predicted_n`) with their milliseconds, as the client measured them from the
    server side; `draft_n`/`draft_n_accepted` only when the response drafted."""

    cache_n: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    prompt_per_token_ms: float | None = None
    prompt_per_second: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_token_ms: float | None = None
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None


class TopLogprob(_Response):
    """One candidate token with its log-probability (`bytes`: its UTF-8)."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobs(TopLogprob):
    """A generated token's log-probability and its most likely alternatives."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    """Chat `logprobs`."""

    content: list[TokenLogprobs]


class CompletionLogprobs(_Response):
    """Legacy completions `logprobs`: parallel lists per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class FunctionCall(_Response):
    """The function a tool call invokes: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(_Response):
    """One tool call of the generated message."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class FunctionCallDelta(_Response):
    """A stream's piece of a function call (`arguments` pieces concatenate)."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Response):
    """A stream's piece of tool call `index` (id, type and name come in its first piece)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class AssistantMessage(_Response):
    """The generated message; `reasoning_content` holds a split-out `<think>` block."""

    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Response):
    """One choice of a chat completion."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_Response):
    """Non-streaming chat completion."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings | None = None


class CompletionChoice(_Response):
    """One choice of a text completion."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(_Response):
    """Non-streaming text completion."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage
    timings: Timings | None = None


class ChatDelta(_Response):
    """What one chat chunk adds to a choice's message."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(_Response):
    """One choice's piece of a chat chunk."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class CompletionChunkChoice(_Response):
    """One choice's piece of a completion chunk (`token_ids` with vLLM's `return_token_ids`)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Response):
    """One SSE event of a streamed chat completion (`choices` empty on the final usage chunk)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    timings: Timings | None = None


class CompletionChunk(_Response):
    """One SSE event of a streamed text completion."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    timings: Timings | None = None
