"""Request and response models of the OpenAI-compatible API (unknown fields are ignored)."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


class _Lenient(BaseModel):
    """Ignores unknown fields, as users of the OpenAI SDK's `extra_body` expect."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    """`stream_options`: include a usage chunk before `[DONE]`."""

    include_usage: bool = False


class TextPart(_Lenient):
    """One text part of a message's content."""

    type: Literal["text"]
    text: str


class ChatMessage(_Lenient):
    """One message of a conversation."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class Speculative(_Lenient):
    """llama.cpp's per-request speculative settings; n_max 0 turns drafting off."""

    n_max: int | None = Field(None, ge=0, le=64)


class SamplingFields(_Lenient):
    """Generation fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=_INT64_MIN, le=_UINT64_MAX)
    stop: Union[str, list[str], None] = None
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    speculative: Speculative | None = None


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions: prompt as a string, strings, token ids, or lists of token ids."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    return_token_ids: bool = False  # vLLM's extension: streamed choices carry their `token_ids`


class TokenizeRequest(_Lenient):
    """POST /tokenize (llama-server shape)."""

    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Lenient):
    """POST /detokenize."""

    tokens: list[int]


class ApplyTemplateRequest(_Lenient):
    """POST /apply-template: render the chat template without generating."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


# ---- responses (documentation for /openapi.json; handlers return plain dicts) ----


class ErrorDetail(BaseModel):
    """The inside of an error response."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """Every error the server answers with."""

    error: ErrorDetail


class Usage(BaseModel):
    """Token counts of one response."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Timings(BaseModel):
    """llama.cpp's `timings`, with the fields this server fills: the response's speculative decoding
    (present only when it drafted)."""

    draft_n: int
    draft_n_accepted: int


class ChatChoice(BaseModel):
    """One choice of a chat completion."""

    index: int
    message: dict[str, Any]
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    """Non-streaming chat completion."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings | None = None


class CompletionChoice(BaseModel):
    """One choice of a text completion."""

    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    """Non-streaming text completion."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    timings: Timings | None = None


class ModelCard(BaseModel):
    """One entry of /v1/models."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = None
    meta: dict[str, Any] | None = None  # the model file: for GGUF its name and quantization type


class ModelList(BaseModel):
    """GET /v1/models."""

    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    """POST /tokenize answer: ids, or {id, piece} objects with `with_pieces`."""

    tokens: list[Union[int, dict[str, Any]]]


class DetokenizeResponse(BaseModel):
    """POST /detokenize answer."""

    content: str


class ApplyTemplateResponse(BaseModel):
    """POST /apply-template answer."""

    prompt: str


class HealthResponse(BaseModel):
    """GET /health when ready."""

    status: str
