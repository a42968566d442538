"""The speculative decoding settings: one nested block of EngineConfig."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

METHODS = ("mtp", "ngram", "draft", "custom")


@dataclass
class SpeculativeConfig:
    """Which drafter proposes tokens and how many.

    method: "mtp" (the checkpoint's multi-token-prediction head, or the one at mtp_path), "ngram"
    (prompt lookup), "draft" (the smaller model at draft_model, same tokenizer; its KV pool has as
    many blocks as the model's and shares the KV budget), or "custom": `drafter_factory(vocab_size=,
    seed=)` builds the drafter in the engine's process (it must pickle; the benchmark oracle,
    onebit/bench/oracle.py, plugs in this way).
    draft_max: most drafted tokens per step. p_min: the MTP head drafts a token only at this
    probability or more. policy: "auto" drafts only while measured step times say it pays;
    "always" drafts draft_max tokens whenever it can (llama.cpp's behaviour; deterministic).
    """

    method: str
    draft_max: int = 3
    policy: str = "auto"
    mtp_path: str | None = None
    p_min: float = 0.0
    draft_model: str | None = None
    drafter_factory: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.method == "oracle":
            raise ValueError("the oracle is a measuring instrument for benchmarks, not a drafter: build it with "
                             "onebit.bench.oracle.oracle_speculation(p, record)")
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, not {self.method!r}")
        if self.policy not in ("auto", "always"):
            raise ValueError("the draft policy must be 'auto' or 'always'")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model (a model directory with the same "
                             "tokenizer)")
        if (self.method == "custom") != (self.drafter_factory is not None):
            raise ValueError("speculative method 'custom' needs drafter_factory, which means nothing without it")
        if self.draft_max < 1:
            raise ValueError("draft_max must be >= 1")
        if not 0.0 <= self.p_min < 1.0:
            raise ValueError("p_min must be in [0, 1)")

    @classmethod
    def coerce(cls, value: "SpeculativeConfig | str | dict | None") -> "SpeculativeConfig | None":
        """Accept a config, a method name ("mtp") or a dict of fields ({"method": "ngram", "draft_max": 2})."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict):
            return cls(**value)
        raise ValueError(f"speculative must be a SpeculativeConfig, a method name or a dict, not {value!r}")
