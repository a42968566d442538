"""What the engine hands back: per-step deltas and whole finished outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass
class RequestOutput:
    """A finished request, as `LLM.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None
    num_cached_tokens: int = 0
    error: str | None = None


@dataclass
class SlotInfo:
    """One decoding slot, in llama-server's /slots shape plus the backend's name."""

    id: int
    backend: str
    is_processing: bool
    request_id: str | None = None
    n_prompt_tokens: int = 0
    n_decoded: int = 0

    def to_json(self) -> dict:
        """The slot as /slots returns it."""
        return {
            "id": self.id,
            "backend": self.backend,
            "is_processing": self.is_processing,
            "id_task": self.request_id,
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_decoded": self.n_decoded,
        }


@dataclass
class EngineStats:
    """Counters a backend reports for /metrics and /props."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    num_kv_blocks: int = 0
    extra: dict = field(default_factory=dict)
