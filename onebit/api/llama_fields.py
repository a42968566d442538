"""llama-server's own response fields, built from our types: `generation_settings`, the
`default_generation_settings` of /props, `stop_type`, and `completion_probabilities`."""

from __future__ import annotations

from onebit.api.state import ServerState
from onebit.protocol import SamplingParams, TokenLogprob

# What a request that sets nothing gets on every route (prepare.sampling_params' defaults).
DEFAULT_PARAMS = SamplingParams(max_tokens=None)


def generation_settings(state: ServerState, params: SamplingParams, stream: bool = False) -> dict:
    """The sampling settings a request ran with, under llama-server's names (`n_predict` -1: no limit)."""
    return {
        "n_predict": -1 if params.max_tokens is None else params.max_tokens,
        "seed": -1 if params.seed is None else params.seed,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "repeat_penalty": params.repetition_penalty,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "stop": list(params.stop),
        "n_probs": params.logprobs or 0,
        "min_keep": 0,
        "ignore_eos": params.ignore_eos,
        "logit_bias": [[token, bias] for token, bias in params.logit_bias.items()],
        "stream": stream,
        "n_ctx": state.n_ctx,
        "model": state.model_name,
    }


def default_generation_settings(state: ServerState) -> dict:
    """/props `default_generation_settings`: one slot's shape with the defaults a request gets."""
    return {"id": 0, "id_task": -1, "n_ctx": state.n_ctx, "speculative": False, "is_processing": False,
            "params": generation_settings(state, DEFAULT_PARAMS), "prompt": ""}


def stop_fields(state: ServerState, finish_reason: str | None, content: str, token_ids: list[int],
                stops: list[str]) -> dict:
    """`stop_type` ("limit", "eos", "word" or "none") and `stopping_word`.

    The engine reports "stop" for both an end token and a stop string; which one it was shows in the
    tokens: the last is an end token, or the decoded tokens continue the content with a stop string."""
    if finish_reason == "length":
        return {"stop_type": "limit", "stopping_word": ""}
    if finish_reason != "stop":
        return {"stop_type": "none", "stopping_word": ""}
    if token_ids and token_ids[-1] in state.tokenizer.eos_token_ids:
        return {"stop_type": "eos", "stopping_word": ""}
    decoded = state.tokenizer.decode(token_ids, skip_special_tokens=True)
    rest = decoded[len(content):] if decoded.startswith(content) else ""
    for word in stops:
        if word and word in rest:
            return {"stop_type": "word", "stopping_word": word}
    return {"stop_type": "eos", "stopping_word": ""}


def _candidate(state: ServerState, token_id: int, logprob: float) -> dict:
    piece = state.piece(token_id)
    return {"id": token_id, "token": piece, "bytes": list(piece.encode("utf-8")), "logprob": logprob}


def completion_probabilities(state: ServerState, items: list[TokenLogprob]) -> list[dict]:
    """`completion_probabilities` for `n_probs`: each generated token with its top alternatives."""
    return [{**_candidate(state, item.token_id, item.logprob),
             "top_logprobs": [_candidate(state, t, lp) for t, lp in item.top]} for item in items]
