"""Speculative decoding: lossless verification, MTP and n-gram drafters, per-request control."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from onebit import LLM, SamplingParams
from onebit.engine.sequence import Sequence
from onebit.engine.speculative import DraftPolicy, ngram_propose, verify
from onebit.models.default_model import default_model_dir

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef list_files(path):",
           "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):"]


def _always_draft(llm: LLM) -> LLM:
    """Pin the draft length to its maximum: the policy's choice depends on measured step times,
    which these tests must not (the policy has its own test above with given times)."""
    policy = llm.engine.policy
    policy.choose = lambda batch: policy.k_max
    return llm


def test_ngram_proposes_what_followed_the_latest_match():
    assert ngram_propose([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert ngram_propose([5, 1, 2, 7, 8, 1, 2], 3) == [7, 8, 1]
    assert ngram_propose([1, 2, 3], 2) == []
    assert ngram_propose([4, 4, 4, 4], 2) == [4]  # latest earlier occurrence of the tail


def test_verification_keeps_the_target_distribution():
    """Point-mass rejection sampling: whatever the draft, the output is distributed as p."""
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    p = logits[0].softmax(-1)
    gen = torch.Generator().manual_seed(1)
    for draft in (0, 3):  # a likely draft and an unlikely one
        seq = Sequence("s", [1], SamplingParams(temperature=1.0), 100, 0)
        counts = Counter()
        n = 6000
        for _ in range(n):
            kept, bonus = verify(logits, seq, [draft], gen)
            counts[draft if kept else bonus] += 1
        for token in range(5):
            assert abs(counts[token] / n - p[token].item()) < 0.025, (draft, token, counts)


def test_greedy_verification_keeps_agreeing_prefix():
    logits = torch.full((4, 6), -5.0)
    for row, target in enumerate([3, 1, 4, 2]):
        logits[row, target] = 5.0
    seq = Sequence("g", [0], SamplingParams(temperature=0), 100, 0)
    assert verify(logits, seq, [3, 1, 5], None) == (2, 4)
    assert verify(logits, seq, [3, 1, 4], None) == (3, 2)
    assert verify(logits, seq, [0, 1, 4], None) == (0, 3)


def test_policy_measures_and_drops_drafting_when_it_costs():
    policy = DraftPolicy(k_max=2)
    step_time = {2: 0.030, 1: 0.020, 0: 0.006}
    tried = []
    for _ in range(3):  # each unmeasured draft length is tried once
        k = policy.choose(64)
        tried.append(k)
        policy.record_step(64, k, step_time[k])
    assert tried == [2, 1, 0]
    assert policy.choose(64) == 0  # drafting triples the step time: plain decode wins
    fast = DraftPolicy(k_max=2)
    for k, t in ((2, 0.0105), (1, 0.0102), (0, 0.010)):
        fast.record_step(1, k, t)
    fast.acceptance = 0.8
    assert fast.choose(1) == 2


@pytest.fixture(scope="module")
def demo_plain():
    llm = LLM(str(default_model_dir()), device="cpu", parallel=4)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    return llm.generate(PROMPTS, params)


@pytest.mark.parametrize("options", [
    {"speculative": "mtp", "parallel": 1},
    {"speculative": "mtp", "parallel": 4},
    {"speculative": "mtp", "parallel": 4, "kv_cache_memory": 24 * 2 * 9 * 16 * 2 * 64 * 4, "block_size": 16},
    {"speculative": "ngram", "parallel": 4, "draft_max": 2},
])
def test_greedy_output_identical_with_speculation(demo_plain, options):
    llm = _always_draft(LLM(str(default_model_dir()), device="cpu", **options))
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outs = [llm.generate([p], params)[0] for p in PROMPTS] if options["parallel"] == 1 else \
        llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in demo_plain]
    assert [o.text for o in outs] == [o.text for o in demo_plain]
    engine = llm.engine
    assert engine.spec_proposed > 0
    if options["speculative"] == "mtp" and options["parallel"] == 1:
        # the trained head: most first drafts are right (the model card measured 77% at depth 1)
        assert engine.spec_accepted / engine.spec_proposed > 0.3
    bm = engine.block_manager
    assert bm.num_free == bm.num_blocks and all(c == 0 for c in bm.ref_count)


def test_request_can_turn_drafting_off_and_sampling_stays_valid():
    llm = _always_draft(LLM(str(default_model_dir()), device="cpu", parallel=2, speculative="mtp"))
    off = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, draft_max=0)
    llm.generate([PROMPTS[0]], off)
    assert llm.engine.spec_proposed == 0
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=40, stop=["\n\n\n"])
    a = llm.generate(PROMPTS, sampled)
    assert all(o.finish_reason in ("stop", "length") and o.token_ids for o in a)
    assert llm.engine.spec_proposed > 0
    assert not llm.engine.has_unfinished()


def test_tiny_generator_writes_an_mtp_head_the_engine_loads(tmp_path, tiny_model_dir):
    from safetensors import safe_open

    from onebit.models.tiny import make_tiny_model
    path = make_tiny_model(tmp_path / "mtp", arch="qwen3", mtp=True)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= names
    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as plain, \
            safe_open(str(path / "model.safetensors"), "pt") as with_head:
        assert torch.equal(plain.get_tensor("model.embed_tokens.weight"), with_head.get_tensor("model.embed_tokens.weight"))
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = LLM(str(tiny_model_dir), device="cpu", parallel=2).generate([[10, 20, 30], [40, 50]], params)
    proposed = {}
    for p_min in (0.0, 0.99):  # a random head is never 99% sure: with that floor it never drafts
        spec = _always_draft(LLM(str(path), device="cpu", parallel=2, speculative="mtp", mtp_p_min=p_min))
        got = spec.generate([[10, 20, 30], [40, 50]], params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        proposed[p_min] = spec.engine.spec_proposed
    assert proposed[0.0] > 0 and proposed[0.99] == 0
