"""Turn validated API requests into prompt token ids and per-choice SamplingParams."""

from __future__ import annotations

import dataclasses

from onebit.api.admission import check_prompt_count
from onebit.api.fim import fim_prompt
from onebit.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from onebit.api.state import ServerState
from onebit.api.structured import output_grammar
from onebit.protocol.grammar import GrammarSpec
from onebit.protocol import InvalidRequest, SamplingParams, check_n, check_prompt
from onebit.protocol.validate import check_int, check_logprobs, check_token

_SEED_MASK = 2**63 - 1
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


def message_to_dict(message: ChatMessage) -> dict:
    """A message as chat templates expect it (text parts joined into one string by a blank line, as
    llama-server joins them)."""
    content = message.content
    if isinstance(content, list):
        content = "\n\n".join(part.text for part in content)
    out = {"role": message.role, "content": content if content is not None else ""}
    for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
        value = getattr(message, key)
        if value is not None:
            out[key] = value
    return out


def _template_call(call, param_messages: str = "messages"):
    """Run a chat template call; template failures are the client's 400."""
    try:
        return call()
    except ValueError as error:
        raise InvalidRequest(f"cannot apply the chat template: {error}", param_messages) from None
    except TypeError as error:  # e.g. a chat_template_kwargs key clashing with a parameter
        raise InvalidRequest(f"cannot apply the chat template: {error}", "chat_template_kwargs") from None


def _split_prefill(messages: list[ChatMessage], add_generation_prompt: bool) -> tuple[list[dict], str | None]:
    """The messages as template dicts, and the text of a final assistant message to continue (prefill),
    as llama-server does: the turns before it get the generation prompt and its text follows. Two
    assistant messages at the end are a 400."""
    dicts = [message_to_dict(m) for m in messages]
    if add_generation_prompt and dicts and dicts[-1]["role"] == "assistant":
        if len(dicts) > 1 and dicts[-2]["role"] == "assistant":
            raise InvalidRequest("Cannot have 2 or more assistant messages at the end of the list.", "messages")
        if not dicts[-1].get("tool_calls"):
            return dicts[:-1], dicts[-1]["content"]
    return dicts, None


def render_chat(state: ServerState, messages: list[ChatMessage], tools=None, template_kwargs=None,
                add_generation_prompt: bool = True) -> str:
    """Apply the model's chat template (the prompt as text), continuing a final assistant message."""
    dicts, prefill = _split_prefill(messages, add_generation_prompt)
    text = _template_call(lambda: state.tokenizer.apply_chat_template(
        dicts, add_generation_prompt=add_generation_prompt, tools=tools, **(template_kwargs or {})))
    return text if prefill is None else text + prefill


def rendered_prompt(state: ServerState, messages: list[ChatMessage], param: str, tools: list[dict] | None = None,
                    template_kwargs: dict | None = None) -> tuple[str, list[int]]:
    """The chat template applied to `messages` (showing `tools`) and the prompt's token ids, checked
    against the vocabulary and the context; `param` names the request field an error points at.
    Special-token strings inside message content are tokenized as plain text (only the template
    makes special tokens). A final assistant message is continued (see `_split_prefill`)."""
    dicts, prefill = _split_prefill(messages, True)
    text, ids = _template_call(lambda: state.tokenizer.chat_prompt_ids(
        dicts, add_generation_prompt=True, tools=tools, **(template_kwargs or {})))
    if prefill:  # the continued message is the client's text: no special tokens in it either
        text, ids = text + prefill, ids + state.tokenizer.encode_plain(prefill)
    return text, check_prompt(ids, state.tokenizer.vocab_size, state.n_ctx, param)


def check_ids(state: ServerState, ids: list[int], param: str) -> None:
    """400 unless every id is inside the vocabulary."""
    for token in ids:
        check_token(token, state.tokenizer.vocab_size, param)


def chat_prompt(state: ServerState, request: ChatCompletionRequest, tools: list[dict] | None = None
                ) -> tuple[str, list[int]]:
    """The chat request's rendered prompt text (showing `tools`) and its token ids (see `rendered_prompt`)."""
    return rendered_prompt(state, request.messages, "messages", tools, request.chat_template_kwargs)


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
        raise InvalidRequest("the prompt is empty", "prompt")
    check_prompt_count(state, len(prompts))
    out = []
    for p in prompts:
        ids = state.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else list(p)
        if request.suffix is not None:
            ids = fim_prompt(state.tokenizer, ids, request.suffix)
        out.append(check_prompt(ids, state.tokenizer.vocab_size, state.n_ctx, "prompt"))
    return out


def completion_prompt_texts(request: CompletionRequest) -> list[str | None]:
    """Each prompt's text where the client sent text (None where it sent token ids)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [None]
    return [p if isinstance(p, str) else None for p in prompt]


UNSUPPORTED = ("prediction", "audio", "functions", "function_call", "web_search_options", "reasoning_effort",
               "verbosity")


def reject_unsupported(request: SamplingFields) -> None:
    """400 naming the first field sent that this server cannot honour (never silently ignored)."""
    for name in UNSUPPORTED:
        if getattr(request, name) is not None:
            hint = "; use tools and tool_choice" if name.startswith("function") else ""
            raise InvalidRequest(f"{name} is not supported{hint}", name)
    if request.best_of is not None and request.best_of != request.n:
        raise InvalidRequest("best_of is not supported (only best_of equal to n)", "best_of")
    if request.store:
        raise InvalidRequest("store is not supported: completions are not stored", "store")
    if request.modalities is not None and request.modalities != ["text"]:
        raise InvalidRequest('only the "text" modality is supported', "modalities")


def sampling_params(state: ServerState, request: SamplingFields, max_tokens: int | None,
                    logprobs: int | None, renames: dict[str, str] | None = None,
                    grammar: GrammarSpec | None = None) -> list[SamplingParams]:
    """One SamplingParams per choice (`n` of them, seeds seed, seed+1, ...), every field checked by the
    shared validation; `renames` maps a SamplingParams field to the request field it came from.
    `grammar` (tool calls) or else the request's own output constraint applies to every choice."""
    check_n(request.n)
    reject_unsupported(request)
    response_grammar = output_grammar(request)
    if grammar is not None and response_grammar is not None:
        raise InvalidRequest("tool_choice required or named cannot be combined with " + response_grammar.param,
                             "tool_choice")
    grammar = grammar or response_grammar
    stop = request.stop
    try:
        base = SamplingParams(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0,
            min_p=request.min_p or 0.0,
            seed=request.seed,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
            logit_bias=request.logit_bias or {},
            logprobs=logprobs,
            draft_max=request.speculative.n_max if request.speculative else None,
            grammar=grammar,
        )
        base.validate(state.tokenizer.vocab_size)
    except InvalidRequest as error:
        error.param = (renames or {}).get(error.param, error.param)
        raise
    if base.seed is not None:
        base.seed &= _SEED_MASK  # seed+i below stays a valid generator seed
    if request.n == 1:
        return [base]
    return [dataclasses.replace(base, seed=None if base.seed is None else (base.seed + i) & _SEED_MASK)
            for i in range(request.n)]


def chat_sampling_params(state: ServerState, request: ChatCompletionRequest,
                         tool_grammar: GrammarSpec | None = None) -> list[SamplingParams]:
    """SamplingParams for a chat request (max_completion_tokens wins over max_tokens); `tool_grammar`
    forces a tool call."""
    renames = {"logprobs": "top_logprobs"}
    max_tokens = request.max_tokens
    if request.max_completion_tokens is not None:
        if max_tokens is not None:
            check_int("max_tokens", max_tokens, 1)
        max_tokens = request.max_completion_tokens
        renames["max_tokens"] = "max_completion_tokens"
    elif max_tokens is None and request.n_predict is not None:
        max_tokens = n_predict_tokens(request.n_predict)
        renames["max_tokens"] = "n_predict"
    check_logprobs(request.top_logprobs, "top_logprobs")
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return sampling_params(state, request, max_tokens, logprobs, renames, tool_grammar)


def completion_sampling_params(state: ServerState, request: CompletionRequest) -> list[SamplingParams]:
    """SamplingParams for a text completion request (16 tokens unless max_tokens or n_predict says)."""
    if request.echo and request.logprobs is not None:
        raise InvalidRequest("echo with logprobs is not supported (the prompt's logprobs are not computed)", "echo")
    if request.echo and request.suffix is not None:
        raise InvalidRequest("echo cannot be combined with suffix", "echo")
    renames = {}
    max_tokens = request.max_tokens
    if max_tokens is None and request.n_predict is not None:
        max_tokens, renames = n_predict_tokens(request.n_predict), {"max_tokens": "n_predict"}
    elif max_tokens is None:
        max_tokens = DEFAULT_COMPLETION_TOKENS
    return sampling_params(state, request, max_tokens, request.logprobs, renames)


def n_predict_tokens(n_predict: int) -> int | None:
    """llama.cpp's `n_predict` as a max_tokens: a negative value means no limit."""
    return None if isinstance(n_predict, int) and not isinstance(n_predict, bool) and n_predict < 0 else n_predict
