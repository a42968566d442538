"""1bit: one GPU, many users. An OpenAI-compatible LLM server with continuous batching."""

from onebit.engine.llm import LLM
from onebit.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"
