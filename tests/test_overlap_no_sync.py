"""On CUDA, launching a step never makes the host wait for the GPU (needs a GPU; skipped here).

With overlapped steps the host prepares step n+1 while the GPU runs step n; one synchronizing call
in the launch (a pageable copy, `.item()`, a Python number written through tensor indices) makes
the host wait for step n and undoes the overlap without any error: G21 (session 11) found
`min_tokens` bans costing 5.7 ms of a served 7-9 ms step that way. This runs every kind of
request the API can send through overlapped steps with PyTorch's sync debug mode on around each
launch, and counts the synchronizing calls it reports.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from onebit import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_launching_overlapped_steps_makes_no_synchronizing_call(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cuda", parallel=8, overlap=True)
    engine = llm.engine
    kinds = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, min_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, logit_bias={5: 2.0, 9: -3.0}),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=40, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.7, min_p=0.05, seed=3, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, logprobs=3, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0, stop=["zz"], max_tokens=24),
    ]
    for i, params in enumerate(kinds):
        engine.add_request(f"r{i}", [(7 * i + j) % 200 + 1 for j in range(40 + 9 * i)], params)
    launch = engine._launch
    reports = []

    def watched(*args):
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = launch(*args)
            reports.extend(str(w.message) for w in caught if "synchroniz" in str(w.message))
            return out
        finally:
            torch.cuda.set_sync_debug_mode("default")

    engine.step()  # the prefill step (eager) outside the watch: its first launches allocate
    engine._launch = watched
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert steps >= 20
    assert reports == []
