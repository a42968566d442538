"""Per-request sampling and stopping parameters, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field


class InvalidParameter(ValueError):
    """A sampling parameter outside its valid range; `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop, for one request (vLLM-like names).

    temperature 0 means greedy. top_k <= 0 disables top-k. max_tokens None means
    "until the context is full". logprobs None returns no log-probabilities; an
    integer n returns the sampled token's logprob plus the top-n alternatives. draft_max caps
    speculative drafts for this request (llama.cpp's "speculative": {"n_max": N}; 0 = off).
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

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self.validate()

    def validate(self) -> None:
        """Raise InvalidParameter naming the first field outside its range."""
        checks = [
            ("temperature", self.temperature >= 0.0, "temperature must be >= 0"),
            ("top_p", 0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            ("top_k", self.top_k >= -1, "top_k must be >= -1 (0 or -1 disables it)"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "min_p must be in [0, 1]"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be >= 1"),
            ("min_tokens", self.min_tokens >= 0, "min_tokens must be >= 0"),
            ("min_tokens", self.max_tokens is None or self.min_tokens <= self.max_tokens,
             "min_tokens must not exceed max_tokens"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0.0, "repetition_penalty must be > 0"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be in [0, 20]"),
            ("seed", self.seed is None or isinstance(self.seed, int), "seed must be an integer"),
            ("speculative.n_max", self.draft_max is None or self.draft_max >= 0, "speculative.n_max must be >= 0"),
        ]
        for param, ok, message in checks:
            if not ok:
                raise InvalidParameter(param, message)
        for token_id, bias in self.logit_bias.items():
            if not -100.0 <= bias <= 100.0:
                raise InvalidParameter("logit_bias", f"logit_bias for token {token_id} must be in [-100, 100]")

    @property
    def greedy(self) -> bool:
        """True when the request always takes the most likely token."""
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """True when any repetition-style penalty is active."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)
