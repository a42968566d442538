"""The offline Python API: `LLM(model).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import itertools
from typing import Sequence as Seq

from onebit.engine.config import EngineConfig
from onebit.engine.build import build_engine
from onebit.engine.outputs import RequestOutput
from onebit.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """A model loaded for offline batched generation (vLLM-like).

    `LLM(model, device="cpu", parallel=8, ctx_size=None, dtype="auto", **engine_options)`;
    engine_options are EngineConfig fields (block_size, kv_cache_memory, max_batch_tokens, ...).
    Speculative decoding: `speculative="mtp"` (or "ngram"), a dict such as
    `{"method": "draft", "draft_model": DIR, "draft_max": 2}`, or a SpeculativeConfig.
    """

    def __init__(self, model: str, device: str = "auto", parallel: int = 8, ctx_size: int | None = None,
                 dtype: str = "auto", **engine_options):
        self.engine = build_engine(EngineConfig(model=str(model), device=device, parallel=parallel,
                                                ctx_size=ctx_size, dtype=dtype, **engine_options))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: Prompt | Seq[Prompt],
                 params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        order, results = [], {}
        for prompt, p in zip(prompts, params):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            request_id = f"offline-{next(self._ids)}"
            self.engine.add_request(request_id, ids, p)
            order.append(request_id)
            results[request_id] = RequestOutput(request_id, ids, [], "", None, [] if p.logprobs is not None else None)
        while self.engine.has_unfinished():
            for delta in self.engine.step():
                out = results.get(delta.request_id)
                if out is None:
                    continue
                out.token_ids.extend(delta.token_ids)
                out.text += delta.text
                if delta.logprobs and out.logprobs is not None:
                    out.logprobs.extend(delta.logprobs)
                if delta.finished:
                    out.finish_reason, out.error = delta.finish_reason, delta.error
                    out.num_cached_tokens = delta.num_cached_tokens
        return [results[request_id] for request_id in order]
