"""The one validation of sampling parameters and prompts: the API, the router and the engine all
call these, so a value is judged the same wherever it arrives.

Every integer is checked to lie within int64 and within its meaning, every float to be finite
and in range, before anything sizes a tensor or a loop from it (issue 17: `top_k` 2**64 once
overflowed the sampler and failed every sequence of its batch).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from onebit.protocol.errors import ContextOverflow, InvalidRequest
from onebit.protocol.grammar import check_grammar

if TYPE_CHECKING:
    from onebit.protocol.types import SamplingParams

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT64_MAX = 2**64 - 1
MAX_CHOICES = 16  # `n`
MAX_LOGPROBS = 20  # `logprobs` / `top_logprobs`
MAX_DRAFT = 64  # `speculative.n_max`
MAX_LOGIT_BIAS = 100.0
MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2]


def check_int(param: str, value, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """`value` as an int in [low, high], else InvalidRequest naming `param`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{param} must be an integer", param)
    if not low <= value <= high:
        raise InvalidRequest(f"{param} must be in [{low}, {high}]", param)
    return value


def check_float(param: str, value, low: float = -math.inf, high: float = math.inf, *,
                low_open: bool = False) -> float:
    """`value` as a finite float in [low, high] (or (low, high] with `low_open`), else InvalidRequest."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{param} must be a number", param)
    value = float(value)
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        opening = "(" if low_open else "["
        raise InvalidRequest(f"{param} must be a finite number in {opening}{low:g}, {high:g}]", param)
    return value


def check_n(n) -> int:
    """The number of choices of one request."""
    return check_int("n", n, 1, MAX_CHOICES)


def check_logprobs(value, param: str = "logprobs") -> int | None:
    """How many alternatives to report per token (None: no logprobs)."""
    return None if value is None else check_int(param, value, 0, MAX_LOGPROBS)


def logit_bias(bias, vocab_size: int | None = None) -> dict[int, float]:
    """`{token id: bias}` from ids or their decimal strings; ids in the vocabulary, biases in [-100, 100]."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else key
        except ValueError:
            token = key
        if isinstance(token, bool) or not isinstance(token, int):
            raise InvalidRequest(f"logit_bias key {key!r} is not a token id", "logit_bias")
        check_token(token, vocab_size, "logit_bias")
        out[token] = check_float("logit_bias", value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    return out


def check_token(token, vocab_size: int | None, param: str) -> None:
    """A token id within the vocabulary (within [0, int64 max] when the vocabulary is unknown)."""
    high = INT64_MAX if vocab_size is None else vocab_size - 1
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= high:
        bound = f"the vocabulary [0, {vocab_size})" if vocab_size is not None else "[0, 2**63)"
        raise InvalidRequest(f"token id {token!r} is outside {bound}", param)


def check_sampling(p: SamplingParams, vocab_size: int | None = None) -> None:
    """Raise InvalidRequest naming the first field of `p` out of range. With the vocabulary size
    known, token ids are checked against it and `top_k` above it is capped to it (same meaning)."""
    p.temperature = check_float("temperature", p.temperature, 0.0)
    p.top_p = check_float("top_p", p.top_p, 0.0, 1.0, low_open=True)
    p.top_k = check_int("top_k", p.top_k, -1)
    if vocab_size is not None and p.top_k > vocab_size:
        p.top_k = vocab_size
    p.min_p = check_float("min_p", p.min_p, 0.0, 1.0)
    if p.seed is not None:
        check_int("seed", p.seed, INT64_MIN, UINT64_MAX)  # what a torch generator takes
    if p.max_tokens is not None:
        check_int("max_tokens", p.max_tokens, 1)
    check_int("min_tokens", p.min_tokens, 0)
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise InvalidRequest("min_tokens must not exceed max_tokens", "min_tokens")
    p.presence_penalty = check_float("presence_penalty", p.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
    p.frequency_penalty = check_float("frequency_penalty", p.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)
    p.repetition_penalty = check_float("repetition_penalty", p.repetition_penalty, 0.0, low_open=True)
    check_logprobs(p.logprobs)
    if p.draft_max is not None:
        check_int("speculative.n_max", p.draft_max, 0, MAX_DRAFT)
    if any(not isinstance(s, str) for s in p.stop):
        raise InvalidRequest("stop must be a string or a list of strings", "stop")
    for token in p.stop_token_ids:
        check_token(token, vocab_size, "stop_token_ids")
    p.logit_bias = logit_bias(p.logit_bias, vocab_size)
    check_grammar(p.grammar)
    if p.grammar is not None and (p.ignore_eos or p.min_tokens):
        # the grammar decides where the output ends; a ban on ending would leave no token to sample
        raise InvalidRequest("ignore_eos and min_tokens cannot be combined with a grammar or schema",
                             "ignore_eos" if p.ignore_eos else "min_tokens")


def check_prompt(ids, vocab_size: int | None, n_ctx: int | None, param: str = "prompt") -> list[int]:
    """A non-empty list of in-vocabulary ids that leaves room to generate (else ContextOverflow)."""
    if not ids:
        raise InvalidRequest("the prompt is empty", param)
    high = INT64_MAX if vocab_size is None else vocab_size - 1
    # The common case in one pass and two builtins (`type is int` also turns bools away: 11 against
    # 22 us for 128 ids); the per-id loop runs only to name the first bad one.
    if not (all(type(token) is int for token in ids) and 0 <= min(ids) and max(ids) <= high):
        for token in ids:
            check_token(token, vocab_size, param)
    if n_ctx is not None and len(ids) >= n_ctx:
        raise ContextOverflow(len(ids), n_ctx, param=param)
    return ids


def check_request(ids, params: SamplingParams, vocab_size: int | None = None, n_ctx: int | None = None) -> None:
    """Everything about one generation request: its prompt, then its sampling parameters."""
    check_prompt(ids, vocab_size, n_ctx)
    check_sampling(params, vocab_size)
