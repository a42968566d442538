"""Test helper: logits at every prompt position, through the engine's real packing and cache."""

from __future__ import annotations

import torch

from onebit import LLM, SamplingParams
from onebit.engine.sequence import Sequence


def all_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Our model's logits [len(ids), vocab] for a prompt, freeing its blocks afterwards."""
    engine = llm.engine
    seq = Sequence("probe", ids, SamplingParams(), engine.ctx_size, 0)
    engine.scheduler.blocks.grow(seq, len(ids))
    try:
        input_ids, positions, meta = engine.runner.prepare([(seq, len(ids))])
        with torch.inference_mode():
            hidden = engine.runner.model(input_ids, positions, engine.runner.kv_cache, meta, engine.runner.rope)
            return engine.runner.model.compute_logits(hidden)
    finally:
        engine.scheduler.blocks.free_sequence(seq)
