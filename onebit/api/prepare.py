"""Turn validated API requests into prompt token ids and per-choice SamplingParams."""

from __future__ import annotations

import dataclasses

from onebit.api.errors import context_overflow, invalid_request
from onebit.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from onebit.api.state import ServerState
from onebit.engine.sampling_params import InvalidParameter, SamplingParams

_SEED_MASK = 2**63 - 1


def message_to_dict(message: ChatMessage) -> dict:
    """A message as chat templates expect it (text parts joined into one string)."""
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text for part in content)
    out = {"role": message.role, "content": content if content is not None else ""}
    for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
        value = getattr(message, key)
        if value is not None:
            out[key] = value
    return out


def render_chat(state: ServerState, messages: list[ChatMessage], tools=None, template_kwargs=None) -> str:
    """Apply the model's chat template; template failures are the client's 400."""
    try:
        return state.tokenizer.apply_chat_template([message_to_dict(m) for m in messages],
                                                   add_generation_prompt=True, tools=tools,
                                                   **(template_kwargs or {}))
    except ValueError as error:
        raise invalid_request(f"cannot apply the chat template: {error}", "messages") from None
    except TypeError as error:  # e.g. a chat_template_kwargs key clashing with a parameter
        raise invalid_request(f"cannot apply the chat template: {error}", "chat_template_kwargs") from None


def check_ids(state: ServerState, ids: list[int], param: str) -> None:
    """400 unless every id is inside the vocabulary."""
    vocab = state.tokenizer.vocab_size
    for token in ids:
        if not 0 <= token < vocab:
            raise invalid_request(f"token id {token} is outside the vocabulary [0, {vocab})", param)


def check_prompt(state: ServerState, ids: list[int], param: str) -> list[int]:
    """Reject empty prompts, unknown token ids, and prompts that leave no room to generate."""
    if not ids:
        raise invalid_request("the prompt is empty", param)
    check_ids(state, ids, param)
    if len(ids) >= state.n_ctx:
        raise context_overflow(len(ids), state.n_ctx)
    return ids


def chat_prompt(state: ServerState, request: ChatCompletionRequest) -> tuple[str, list[int]]:
    """The rendered prompt text and its token ids."""
    text = render_chat(state, request.messages, request.tools, request.chat_template_kwargs)
    ids = state.tokenizer.encode(text, add_special_tokens=False)
    return text, check_prompt(state, ids, "messages")


def completion_prompts(state: ServerState, request: CompletionRequest) -> list[list[int]]:
    """Every prompt of a completion request as token ids."""
    prompt = request.prompt
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]
    else:
        prompts = list(prompt)
    if not prompts:
        raise invalid_request("the prompt is empty", "prompt")
    out = []
    for p in prompts:
        ids = state.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else list(p)
        out.append(check_prompt(state, ids, "prompt"))
    return out


def completion_prompt_texts(request: CompletionRequest) -> list[str | None]:
    """Each prompt's text where the client sent text (None where it sent token ids)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [None]
    return [p if isinstance(p, str) else None for p in prompt]


def _logit_bias(state: ServerState, bias: dict[str, float] | None) -> dict[int, float]:
    out = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise invalid_request(f"logit_bias key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < state.tokenizer.vocab_size:
            raise invalid_request(f"logit_bias token {token} is outside the vocabulary", "logit_bias")
        out[token] = value
    return out


def sampling_params(state: ServerState, request: SamplingFields, max_tokens: int | None,
                    logprobs: int | None) -> list[SamplingParams]:
    """One SamplingParams per choice (`n` of them, seeds seed, seed+1, ...)."""
    stop = request.stop
    if isinstance(stop, str):
        stop = [stop]
    try:
        base = SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0,
            min_p=request.min_p or 0.0,
            seed=None if request.seed is None else request.seed & _SEED_MASK,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            stop=list(stop or []),
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
            logit_bias=_logit_bias(state, request.logit_bias),
            logprobs=logprobs,
            draft_max=request.speculative.n_max if request.speculative else None,
        )
    except InvalidParameter as error:
        raise invalid_request(str(error), error.param) from None
    if request.n == 1:
        return [base]
    return [dataclasses.replace(base, seed=None if base.seed is None else (base.seed + i) & _SEED_MASK)
            for i in range(request.n)]


def chat_sampling_params(state: ServerState, request: ChatCompletionRequest) -> list[SamplingParams]:
    """SamplingParams for a chat request (max_completion_tokens wins over max_tokens)."""
    max_tokens = request.max_completion_tokens or request.max_tokens
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return sampling_params(state, request, max_tokens, logprobs)


def completion_sampling_params(state: ServerState, request: CompletionRequest) -> list[SamplingParams]:
    """SamplingParams for a text completion request."""
    if request.echo:
        raise invalid_request("echo is not supported", "echo")
    return sampling_params(state, request, request.max_tokens, request.logprobs)
