"""Request and response models of the OpenAI-compatible API (unknown fields are ignored).

Request models check shapes and types only; every range is checked once, by the shared
validation in `onebit.protocol.validate`. The completion responses and their stream chunks are
in `onebit/api/responses.py`."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

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

    n_max: int | None = None


class SamplingFields(_Lenient):
    """Generation fields shared by chat and text completions."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    priority: int | None = None  # vLLM's: lower is sooner, among one user's requests
    ignore_eos: bool = False
    min_tokens: int = 0
    speculative: Speculative | None = None
    response_format: Any = None  # {"type": "text" | "json_object" | "json_schema", ...}
    json_schema: Any = None  # llama-server: constrain the output to this schema
    grammar: Any = None  # llama-server: a GBNF grammar the output must match
    # OpenAI fields this server cannot honour: named here so that sending one is a 400, not ignored
    best_of: Any = None
    prediction: Any = None
    audio: Any = None
    modalities: Any = None
    functions: Any = None
    function_call: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    store: Any = None
    n_predict: int | None = None  # llama.cpp's name for max_tokens (-1: no limit)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None


class CompletionRequest(SamplingFields):
    """POST /v1/completions: prompt as a string, strings, token ids, or lists of token ids."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = None  # 16 unless n_predict says otherwise
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None  # fill-in-the-middle: the text after the completion
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
    add_generation_prompt: bool = True


# ---- responses (completions and their chunks: onebit/api/responses.py) ----


class ErrorDetail(BaseModel):
    """The inside of an error response."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """Every error the server answers with."""

    error: ErrorDetail


class ModelCard(BaseModel):
    """One entry of /v1/models."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None = None
    aliases: list[str] | None = None  # every name given with --alias, when several were
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
