"""The types that cross layers: the request the API hands the router and backends, and the
per-step delta that comes back (plain dataclasses: they pickle across the worker pipe)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from onebit.protocol.grammar import GrammarSpec
from onebit.protocol.validate import check_sampling


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop, for one request (vLLM-like names), validated on
    construction by the shared validation (`onebit.protocol.validate.check_sampling`).

    temperature 0 means greedy. top_k <= 0 disables top-k. max_tokens None means
    "until the context is full". logprobs None returns no log-probabilities; an
    integer n returns the sampled token's logprob plus the top-n alternatives. draft_max caps
    speculative drafts for this request (llama.cpp's "speculative": {"n_max": N}; 0 = off).
    grammar constrains every sampled token (see onebit.protocol.grammar).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    skip_special_tokens: bool = True
    draft_max: int | None = None
    grammar: GrammarSpec | None = None  # output constraint (response_format, json_schema, grammar, tools)
    pooling: str | None = None  # an embedding request: pool the prompt's final states (mean, last, cls)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s != ""]
        self.stop_token_ids = list(self.stop_token_ids)
        self.validate()

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequest naming the first field outside its range (see check_sampling)."""
        check_sampling(self, vocab_size)

    @property
    def greedy(self) -> bool:
        """True when the request always takes the most likely token."""
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """True when any repetition-style penalty is active."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


@dataclass
class Resumed:
    """A request continued on another backend (a migration): the last `num_generated` tokens of
    its prompt are output it had already generated, of which the client already got `text`.

    A backend that knows its tokenizer (the native engine) rebuilds the detokenizer and the
    stop-string state from them, so text held back at the break (a possible stop string, half
    a character) is released or cut exactly as it would have been; penalties count them as output.
    """

    num_generated: int
    text: str


@dataclass
class GenerateRequest:
    """One generation request as the router hands it to a backend (already tokenized).

    `user` names whose request it is (an API key's name, the OpenAI `user` field, or "anonymous"):
    slots and prefill are shared fairly between users. `priority` orders one user's requests
    (lower is sooner, vLLM's convention)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt_text: str | None = None  # the same prompt as text, for peers that cannot take token ids
    user: str = "anonymous"
    priority: int = 0
    resumed: Resumed | None = None  # set when this continues a request another backend started


@dataclass
class TokenLogprob:
    """Log-probability of one generated token and its top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class StepDelta:
    """What one engine step produced for one request.

    `text` is the newly decoded text (stop strings already removed). A delta with
    `finished=True` is the request's last; `finish_reason` is "stop", "length",
    "abort" or "error" (then `error` says why).
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_draft_tokens: int = 0  # drafts verified for this request so far
    num_accepted_tokens: int = 0  # of which the target kept
    embedding: list[float] | None = None  # an embedding request's pooled, normalized vector (last delta)

    def then(self, later: "StepDelta") -> "StepDelta":
        """One delta carrying this one's tokens followed by `later`'s (a later delta of the same
        request): what a consumer that fell a few steps behind can send as one event."""
        logprobs = None
        if self.logprobs is not None or later.logprobs is not None:
            logprobs = (self.logprobs or []) + (later.logprobs or [])
        return dataclasses.replace(later, token_ids=self.token_ids + later.token_ids, text=self.text + later.text,
                                   logprobs=logprobs)
