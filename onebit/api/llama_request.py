"""llama-server's native request shapes (`POST /completion`, `POST /infill`) and their prompts."""

from __future__ import annotations

from typing import Any

from onebit.api.prepare import n_predict_tokens, sampling_params
from onebit.api.protocol import SamplingFields
from onebit.api.state import ServerState
from onebit.protocol import InvalidRequest, SamplingParams, check_prompt
from onebit.protocol.validate import check_int, check_logprobs

# Fill-in-the-middle tokens (prefix, suffix, middle) of the model families that have them.
FIM_TOKENS = [("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
              ("<PRE>", "<SUF>", "<MID>")]


class LlamaCompletionRequest(SamplingFields):
    """POST /completion: `prompt` as text, token ids, text and ids mixed, or a list of prompts."""

    prompt: Any = None
    n_probs: int = 0
    cache_prompt: bool = True  # prefix caching is server-wide: accepted, always on
    id_slot: int = -1  # checked against the slots and echoed; the router still picks the slot
    return_tokens: bool = False
    repeat_penalty: float | None = None


class InfillRequest(LlamaCompletionRequest):
    """POST /infill: code between `input_prefix` and `input_suffix`; `prompt` is appended after the middle
    token, `input_extra` ({filename, text} chunks) goes before the prefix."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[dict[str, Any]] | None = None


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_prompt(state: ServerState, prompt, param: str) -> list[int]:
    """Text, ids, or text and ids mixed (each text piece tokenized, the first with the model's BOS)."""
    if isinstance(prompt, str):
        return state.tokenizer.encode(prompt, add_special_tokens=True)
    if not isinstance(prompt, list):
        raise InvalidRequest("prompt must be a string, token ids, or a list of them", param)
    ids: list[int] = []
    for i, piece in enumerate(prompt):
        if _is_id(piece):
            ids.append(piece)
        elif isinstance(piece, str):
            ids.extend(state.tokenizer.encode(piece, add_special_tokens=i == 0))
        else:
            raise InvalidRequest("a prompt's items must be token ids or strings", param)
    return ids


def llama_prompts(state: ServerState, prompt) -> list[tuple[list[int], str]]:
    """Every prompt of a /completion request as (token ids, text). A list holding any token id is one
    mixed prompt; a list of strings or lists is several prompts."""
    if isinstance(prompt, list) and prompt and not any(_is_id(p) for p in prompt):
        prompts = prompt
    else:
        prompts = [prompt]
    if prompt is None or prompt == "" or prompt == []:
        raise InvalidRequest("the prompt is empty", "prompt")
    out = []
    for i, p in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
        ids = check_prompt(_one_prompt(state, p, param), state.tokenizer.vocab_size, state.n_ctx, param)
        text = p if isinstance(p, str) else state.tokenizer.decode(ids, skip_special_tokens=False)
        out.append((ids, text))
    return out


def fim_prompt(state: ServerState, request: InfillRequest) -> tuple[list[int], str]:
    """The fill-in-the-middle prompt (extra context, prefix, suffix, middle, then `prompt`); a 400 when
    the model has no FIM tokens."""
    tok = state.tokenizer
    for names in FIM_TOKENS:
        ids = [tok.token_to_id(name) for name in names]
        if all(i is not None for i in ids):
            break
    else:
        raise InvalidRequest("this model has no fill-in-the-middle tokens: /infill is not supported",
                             "input_prefix", code="not_supported")
    prefix, suffix, middle = ids
    extra = "".join(f"{chunk.get('filename', '')}\n{chunk.get('text', '')}" for chunk in request.input_extra or [])
    body = ([prefix] + tok.encode(extra + request.input_prefix) + [suffix] + tok.encode(request.input_suffix)
            + [middle] + (tok.encode(request.prompt) if isinstance(request.prompt, str) else []))
    ids = check_prompt(body, tok.vocab_size, state.n_ctx, "input_prefix")
    return ids, tok.decode(ids, skip_special_tokens=False)


def llama_sampling_params(state: ServerState, request: LlamaCompletionRequest) -> SamplingParams:
    """The one SamplingParams of a /completion request: `n_predict` (or max_tokens; -1 no limit),
    `n_probs`, `repeat_penalty`, and the sampling fields every route shares."""
    if request.n != 1:
        raise InvalidRequest("/completion generates one result per prompt; n must be 1", "n")
    check_logprobs(request.n_probs, "n_probs")
    slots = sum(r.limit for r in state.router.routes)
    check_int("id_slot", request.id_slot, -1, slots - 1)
    if request.repeat_penalty is not None and request.repetition_penalty is None:
        request.repetition_penalty = request.repeat_penalty
    renames = {"logprobs": "n_probs", "repetition_penalty": "repeat_penalty"}
    max_tokens = request.max_tokens
    if max_tokens is None and request.n_predict is not None:
        max_tokens, renames["max_tokens"] = n_predict_tokens(request.n_predict), "n_predict"
    return sampling_params(state, request, max_tokens, request.n_probs or None, renames)[0]
