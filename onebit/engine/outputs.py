"""What the engine hands back: per-step deltas and whole finished outputs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from onebit.protocol.types import StepDelta, TokenLogprob  # noqa: F401  (the shared types, re-exported here)


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
    regime: str | None = None  # one-engine --adaptive: "speculative" (the primary's) or "batch"

    def to_json(self) -> dict:
        """The slot as /slots returns it."""
        out = {
            "id": self.id,
            "backend": self.backend,
            "is_processing": self.is_processing,
            "id_task": self.request_id,
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_decoded": self.n_decoded,
        }
        if self.regime is not None:
            out["regime"] = self.regime
        return out


@dataclass
class SpecStats:
    """Speculative decoding counters since the engine started.

    `drafted_at[i]` / `accepted_at[i]`: how often a verification had an (i+1)-th draft, and how
    often the target kept it. `draft_steps` of the `decode_steps` verified drafts.
    """

    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    decode_steps: int = 0
    draft_steps: int = 0

    def record_verification(self, drafted: int, accepted: int) -> None:
        """Count one verification: `drafted` drafts, of which the first `accepted` were kept."""
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        missing = drafted - len(self.drafted_at)
        if missing > 0:
            self.drafted_at += [0] * missing
            self.accepted_at += [0] * missing
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    def record_step(self, drafted: bool) -> None:
        """Count one decode step, and whether it verified drafts."""
        self.decode_steps += 1
        self.draft_steps += drafted

    def copy(self) -> SpecStats:
        """A snapshot that later counting does not change."""
        return dataclasses.replace(self, drafted_at=list(self.drafted_at), accepted_at=list(self.accepted_at))


@dataclass
class EngineStats:
    """Counters a backend reports for /metrics and /props (`spec`: None when it has no engine of ours)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    num_kv_blocks: int = 0
    extra: dict = field(default_factory=dict)
    spec: SpecStats | None = None
