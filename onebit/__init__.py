"""1bit: one GPU, many users. An OpenAI-compatible LLM server with continuous batching."""

from __future__ import annotations

from onebit._version import __version__

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # Lazy: `1bit bench` and its client processes never need torch, which takes seconds to import.
    if name == "LLM":
        from onebit.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from onebit.engine.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'onebit' has no attribute {name!r}")
