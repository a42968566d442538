"""Speculative decoding: lossless verification, MTP, n-gram and draft-model drafters, per-request control."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from onebit import LLM, SamplingParams
from onebit.engine.outputs import SpecStats
from onebit.engine.sequence import Sequence
from onebit.engine.spec.ngram import ngram_propose
from onebit.engine.spec.policy import DraftPolicy
from onebit.engine.spec.verify import verify
from onebit.models.default_model import default_model_dir

PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef list_files(path):",
           "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):"]


def _always_draft(llm: LLM) -> LLM:
    """Pin the draft length to its maximum: the policy's choice depends on measured step times,
    which these tests must not (the policy has its own test above with given times)."""
    policy = llm.engine.speculator.policy
    policy.choose = lambda batch, drafting=None: policy.k_max
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
    for _ in range(6):  # each unmeasured draft length is tried twice: a warm-up step, then a kept one
        k = policy.choose(64)
        tried.append(k)
        policy.record_step(64, k, step_time[k])
    assert tried == [2, 2, 1, 1, 0, 0]
    assert policy.choose(64) == 0  # drafting triples the step time: plain decode wins
    fast = DraftPolicy(k_max=2)
    for k, t in ((2, 0.0105), (1, 0.0102), (0, 0.010)):
        _record_twice(fast, 1, k, t)
    fast.acceptance = 0.8
    assert fast.choose(1) == 2


def _record_twice(policy: DraftPolicy, batch: int, k: int, seconds: float, **kw) -> None:
    """A pair's first step is its warm-up (not kept); the second is its first kept time."""
    policy.record_step(batch, k, seconds, **kw)
    policy.record_step(batch, k, seconds, **kw)


def test_policy_enters_drafting_only_by_a_margin_and_stays_while_it_wins():
    """Leaving drafting starts the next plain step cold, so near a tie the policy keeps what it
    does: from plain steps it drafts only when drafting is ENTER_MARGIN faster."""
    policy = DraftPolicy(k_max=1, explore_every=10 ** 6)
    policy.acceptance = 0.5  # 1.5 tokens per drafting step
    _record_twice(policy, 1, 0, 0.010)
    _record_twice(policy, 1, 1, 0.014)  # 1.5 / 14 ms: 7% faster than 1 / 10 ms
    policy.last_k = 0
    assert policy.choose(1) == 0 and policy.choose(1) == 0
    policy.last_k = 1  # (an exploration step drafted)
    assert policy.choose(1) == 1 and policy.choose(1) == 1
    _record_twice(policy, 1, 1, 0.012)  # median of 14, 14, 12, 12 ms: 13 ms, 15% faster
    policy.last_k = 0
    assert policy.choose(1) == 1
    for _ in range(5):
        policy.record_step(1, 1, 0.020)  # drafting got slow: plain wins, and is left for at once
    assert policy.choose(1) == 0


def test_policy_re_measures_plain_steps_while_drafting():
    """While drafting, a plain-step re-measurement runs PROBE_STEPS plain steps (the first cold,
    the last done with no launch behind it: not steady); the middle one's time replaces a stale
    estimate, and the policy leaves drafting that no longer pays."""
    policy = DraftPolicy(k_max=1, explore_every=16)
    policy.acceptance = 0.5
    _record_twice(policy, 64, 0, 0.020)  # measured under a load that has gone (stale, too high)
    _record_twice(policy, 64, 1, 0.016)
    choices = []
    for _ in range(40):
        k = policy.choose(64)
        choices.append(k)
        steady = not (k == 0 and choices[-2:-1] != [0])  # a plain step after a drafting one is cold
        policy.record_step(64, k, 0.010 if k == 0 else 0.016, steady=steady)
    first_plain = choices.index(0)
    assert choices[first_plain:first_plain + 3] == [0, 0, 0]
    assert policy.times[(0, 64)] == 0.010  # the stale 20 ms is gone
    assert choices[0] == 1 and choices[-6:] == [0] * 6  # 1.5 tokens / 16 ms lose to 1 / 10 ms (35-40:
    # after the re-measurement of drafting at steps 32-34)


def test_policy_keeps_steps_with_a_prompt_chunk_only_while_nothing_better_is_known():
    policy = DraftPolicy(k_max=1)
    policy.record_step(8, 0, 0.010)  # warm-up
    policy.record_step(8, 0, 0.030, mixed=True)  # a level's start: all steps carry prompts
    assert policy.times[(0, 8)] == 0.030
    policy.record_step(8, 0, 0.010)
    policy.record_step(8, 0, 0.010)
    for _ in range(5):
        policy.record_step(8, 0, 0.030, mixed=True)  # now ignored
    assert policy.times[(0, 8)] == 0.010


def test_engine_marks_steps_that_carry_a_prompt_chunk(tiny_model_dir):
    """A request that starts while another decodes rides along in a decode step: that step is
    timed as mixed; the pure decode steps around it are not."""
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, overlap=True, speculative="ngram")
    policy = llm.engine.speculator.policy
    seen = []
    record = policy.record_step
    policy.record_step = lambda batch, k, seconds, steady=True, mixed=False: (
        seen.append(mixed), record(batch, k, seconds, steady, mixed))
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 12, 6)]
    llm.generate([[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]], params)
    assert seen.count(True) >= 1 and seen.count(False) >= 5


def test_policy_survives_a_compiling_first_step_and_re_measures_stale_pairs():
    """On the GPU a draft length's first step may compile kernels or capture a graph (seconds):
    kept, it ruled drafting out for good (G14, session 9: 186 tok/s at one request, 2 tokens drafted,
    where drafting made 486). The warm-up step is not kept; a later stall that was kept is replaced
    by the next time far below it, which the periodic re-measurement of the stalest pair brings."""
    policy = DraftPolicy(k_max=1, explore_every=8)
    policy.acceptance = 0.7
    policy.record_step(1, 1, 2.0)  # warm-up: a compile
    policy.record_step(1, 1, 0.006)
    _record_twice(policy, 1, 0, 0.005)
    assert policy.times[(1, 1)] == 0.006
    assert policy.choose(1) == 1  # 1.7 tokens in 6 ms beat 1 in 5 ms
    policy.record_step(1, 1, 1.5)  # a stall kept in the estimate...
    picks = []
    for _ in range(12):  # steps 2-13: the re-measurement comes at step 8
        k = policy.choose(1)
        picks.append(k)
        policy.record_step(1, k, 0.006 if k else 0.005)
    assert picks[0] == 0 and 1 in picks  # ...makes plain steps win until k=1 is re-measured
    assert policy.times[(1, 1)] == 0.006 and picks[-1] == 1


def test_policy_compares_steady_rates_and_skips_cold_plain_steps():
    """A drafting step's time already holds the host work it exposes, so drafting is weighed at
    its steady rate; the plain step after it starts cold and its wall time (which spans the next
    launch) is not a steady plain step's cost."""
    policy = DraftPolicy(k_max=1)
    policy.acceptance = 0.5  # k=1: 1.5 tokens for the drafting rows
    _record_twice(policy, 64, 1, 0.0105)
    _record_twice(policy, 64, 0, 0.0100)
    policy.record_step(64, 0, 0.0250, steady=False)
    assert policy.times[(0, 64)] == 0.0100
    # 8 of 64 rows draft: (56 + 8 * 1.5) / 10.5 ms beats 64 / 10 ms, by too little to leave plain
    # steps for, but enough to keep drafting...
    assert policy.choose(64, drafting=8) == 0
    policy.last_k = 1
    assert policy.choose(64, drafting=8) == 1
    # ...but 2 of 64 do not: 65 / 10.5 ms against 64 / 10 ms
    assert policy.choose(64, drafting=2) == 0


@pytest.fixture(scope="module")
def demo_plain():
    llm = LLM(str(default_model_dir()), device="cpu", parallel=4)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    return llm.generate(PROMPTS, params)


@pytest.mark.parametrize("options", [
    {"speculative": "mtp", "parallel": 1},
    {"speculative": "mtp", "parallel": 4},
    {"speculative": "mtp", "parallel": 4, "kv_cache_memory": 24 * 2 * 9 * 16 * 2 * 64 * 4, "block_size": 16},
    {"speculative": {"method": "ngram", "draft_max": 2}, "parallel": 4},
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
    bm = engine.scheduler.blocks
    assert bm.num_free == bm.num_blocks and all(c == 0 for c in bm.ref_count)


def test_a_drafter_with_nothing_to_offer_is_timed_and_counted_as_missing(tiny_model_dir):
    """Steps chosen to draft that drafted nothing (an n-gram drafter without a match) are timed
    under their draft length and count as first drafts rejected, so the policy learns they do not
    pay instead of choosing them (and losing overlap) on every step."""
    llm = _always_draft(LLM(str(tiny_model_dir), device="cpu", parallel=2, overlap=True, speculative="ngram"))
    engine = llm.engine
    engine.speculator.drafter.propose_one = lambda seq, k: []  # never a match
    policy = engine.speculator.policy
    prior = policy.acceptance
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([[5, 6, 7, 8], [9, 10, 11]], params)
    assert all(len(o.token_ids) == 12 for o in outs)
    assert engine.spec_proposed == 0
    assert policy.acceptance < prior * 0.9 ** 16  # about 20 misses (two rows, 11 decode steps), each a rejected first draft
    assert any(k == policy.k_max for k, _ in policy.times), policy.times  # timed as drafting steps
    assert not any(k == 0 for k, _ in policy.times)  # ...not as plain ones


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

    from onebit.testing.tiny import make_tiny_model
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
        spec = _always_draft(LLM(str(path), device="cpu", parallel=2, speculative={"method": "mtp", "p_min": p_min}))
        got = spec.generate([[10, 20, 30], [40, 50]], params)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        proposed[p_min] = spec.engine.spec_proposed
    assert proposed[0.0] > 0 and proposed[0.99] == 0


# -- draft model (--draft-model) ---------------------------------------------------------------

DRAFT_PROMPTS = [[10, 20, 30], [40, 50], list(range(100, 160)), [7], [300, 301, 302, 303], list(range(200, 230)),
                 [11, 12, 11, 12, 11], [499, 3]]


def _draft_llm(target, draft, **options) -> LLM:
    options = {"parallel": 8, "max_batch_tokens": 32, **options}
    return _always_draft(LLM(str(target), device="cpu", speculative={"method": "draft", "draft_model": str(draft)},
                             **options))


def _pools_empty(llm: LLM) -> None:
    drafter = llm.engine.speculator.drafter
    for bm in (llm.engine.scheduler.blocks, drafter.blocks):
        assert bm.num_free == bm.num_blocks and all(c == 0 for c in bm.ref_count)
    assert not drafter.proxies


@pytest.fixture(scope="module")
def draft_models(tiny_models):
    """(target, {"self": the target itself, "other": a different random model with its tokenizer})."""
    target = tiny_models("qwen3")
    return target, {"self": target, "other": tiny_models("llama", layers=1, seed=1)}


DRAFT_PARAMS = [SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, draft_max=m)
                for m in (None, 0, 1, 2, 3, None, 1, 2)]


@pytest.fixture(scope="module")
def draft_plain(draft_models):
    """Plain greedy outputs of the target for DRAFT_PROMPTS."""
    return LLM(str(draft_models[0]), device="cpu", parallel=8, max_batch_tokens=32).generate(DRAFT_PROMPTS, DRAFT_PARAMS)


@pytest.mark.parametrize("which", ["self", "other"])
@pytest.mark.parametrize("preempt", [False, True])
def test_draft_model_greedy_output_identical(draft_models, draft_plain, which, preempt):
    """Alone and in a batch of 8 with per-request draft_max, and with a KV budget of 16 blocks (both
    pools) that forces preemptions. A tiny qwen3 block is 8192 bytes, a 1-layer llama one 4096."""
    target, drafts = draft_models
    options = {"kv_cache_memory": 16 * (8192 + (8192 if which == "self" else 4096))} if preempt else {}
    llm = _draft_llm(target, drafts[which], **options)
    for i in (0, 2):
        assert llm.generate([DRAFT_PROMPTS[i]], DRAFT_PARAMS[i])[0].token_ids == draft_plain[i].token_ids
    got = llm.generate(DRAFT_PROMPTS, DRAFT_PARAMS)
    assert [o.token_ids for o in got] == [o.token_ids for o in draft_plain]
    engine = llm.engine
    assert engine.spec_proposed > 0
    if which == "self":  # the same model drafts exactly what it will verify
        assert engine.spec_accepted == engine.spec_proposed
    assert (engine.scheduler.num_preemptions > 0) == preempt
    _pools_empty(llm)


def test_draft_model_sampling_and_aborts_free_both_pools(draft_models):
    target, drafts = draft_models
    llm = _draft_llm(target, drafts["other"], parallel=3)
    engine = llm.engine
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=30, ignore_eos=True)
    for i, prompt in enumerate(DRAFT_PROMPTS[:5]):
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(6):
        engine.step()
    assert engine.speculator.drafter.proxies and engine.spec_proposed > 0  # some are drafting when aborted
    for rid in ("r0", "r2", "r4"):
        engine.abort(rid)
    finals = {}
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.finished:
                finals[delta.request_id] = delta.finish_reason
    assert finals == {"r0": "abort", "r1": "length", "r2": "abort", "r3": "length", "r4": "abort"}
    _pools_empty(llm)


def test_draft_model_with_another_tokenizer_fails_clearly(tmp_path, tiny_models, draft_models):
    import json
    import shutil

    target, _ = draft_models
    bigger = tiny_models("qwen3", vocab=600)
    with pytest.raises(ValueError, match="tokenizer of 600 tokens, the model's has 512"):
        LLM(str(target), device="cpu", speculative={"method": "draft", "draft_model": str(bigger)})
    swapped = tmp_path / "swapped"  # same size, two tokens trade ids
    shutil.copytree(target, swapped)
    data = json.loads((swapped / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a = vocab["a"]
    vocab["a"], vocab["b"] = vocab["b"], a
    (swapped / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"token id {a} is 'b' for the draft model, 'a' for the model"):
        LLM(str(target), device="cpu", speculative={"method": "draft", "draft_model": str(swapped)})
    with pytest.raises(ValueError, match="needs draft_model"):
        LLM(str(target), device="cpu", speculative="draft")


def test_draft_model_cli_errors_are_clear(tmp_path, tiny_models, draft_models, capsys):
    """Checked before the server starts: one drafter, a local directory, the same tokenizer."""
    from onebit.cli import main
    target, _ = draft_models
    for args, message in ((["--draft-model", str(target), "--ngram"], "--ngram and --draft-model are two drafters"),
                          (["--draft-model", str(target), "--mtp", "--ngram"], "are three drafters"),
                          (["--draft-model", str(tmp_path / "nope")], "does not exist"),
                          (["--draft-model", str(tiny_models("qwen3", vocab=600))], "same tokenizer")):
        assert main(["serve", "-m", str(target), *args]) == 1
        assert message in capsys.readouterr().err


def test_serve_with_draft_model_matches_plain_greedy(draft_models):
    from server_utils import SERVER_ARGS, openai_clients, running_server
    target, drafts = draft_models
    prompt = "def add(a, b):"
    want = LLM(str(target), device="cpu", parallel=2).generate(
        [prompt], SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0].text
    with running_server(target, "--draft-model", str(drafts["other"]), *SERVER_ARGS) as server:
        client, _ = openai_clients(server)
        for body in ({}, {"speculative": {"n_max": 2}}):
            done = client.completions.create(model="tiny", prompt=prompt, max_tokens=32, temperature=0,
                                             extra_body={"ignore_eos": True, **body})
            assert done.choices[0].text == want and done.usage.completion_tokens == 32


def test_spec_stats_count_each_draft_position():
    spec = SpecStats()
    spec.record_verification(3, 1)
    spec.record_verification(1, 1)
    spec.record_verification(2, 0)
    assert (spec.draft_tokens, spec.accepted_tokens) == (6, 2)
    assert spec.drafted_at == [3, 2, 1] and spec.accepted_at == [2, 0, 0]
    snapshot = spec.copy()
    spec.record_verification(1, 1)
    assert snapshot.drafted_at == [3, 2, 1]  # a snapshot does not move with the engine


def test_draft_counters_add_up_per_position_and_per_request():
    llm = _always_draft(LLM(str(default_model_dir()), device="cpu", parallel=4, speculative="ngram"))
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", llm.tokenizer.encode(prompt), params)
    final = {}
    while engine.has_unfinished():
        for delta in engine.step():
            assert 0 <= delta.num_accepted_tokens <= delta.num_draft_tokens
            if delta.finished:
                final[delta.request_id] = delta
    spec = engine.stats().spec
    assert spec.draft_tokens > 0
    assert sum(spec.drafted_at) == spec.draft_tokens and sum(spec.accepted_at) == spec.accepted_tokens
    assert len(spec.drafted_at) <= engine.config.speculative.draft_max
    # a draft at position i+1 comes after one at position i, and is kept only if that one was
    assert spec.drafted_at == sorted(spec.drafted_at, reverse=True)
    assert spec.accepted_at == sorted(spec.accepted_at, reverse=True)
    assert all(a <= d for a, d in zip(spec.accepted_at, spec.drafted_at))
    assert sum(d.num_draft_tokens for d in final.values()) == spec.draft_tokens
    assert sum(d.num_accepted_tokens for d in final.values()) == spec.accepted_tokens
    assert 0 < spec.draft_steps <= spec.decode_steps
    assert engine.stats().extra == {"spec_draft_tokens": spec.draft_tokens,
                                    "spec_accepted_tokens": spec.accepted_tokens}


def test_oracle_proposes_the_record_with_probability_p():
    from onebit.bench.oracle import OracleDrafter
    truth = [5, 6, 7, 8, 9, 10, 11, 12]
    seq = Sequence("o", [1, 2, 3], SamplingParams(temperature=0), 100, 0)
    seq.append(5)
    right = OracleDrafter({(1, 2, 3): truth}, 1.0, vocab_size=50)
    assert right.propose_one(seq, 3) == [6, 7, 8]
    wrong = OracleDrafter({(1, 2, 3): truth}, 0.0, vocab_size=50).propose_one(seq, 3)
    assert len(wrong) == 3 and all(d != t for d, t in zip(wrong, [6, 7, 8]))
    assert right.propose([(Sequence("x", [9], SamplingParams(), 100, 0), 3)])[0][1] == []  # prompt not recorded
    half = OracleDrafter({(1, 2, 3): truth}, 0.5, vocab_size=50, seed=3)
    hits = sum(d == 6 for d in (half.propose_one(seq, 1)[0] for _ in range(2000)))
    assert 900 < hits < 1100


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_oracle_engine_is_lossless_and_accepts_what_it_should(tmp_path, p):
    from onebit.bench.oracle import OracleDrafter, oracle_speculation
    prompts = [[10, 20, 30, 40], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    model = str(default_model_dir())
    want = LLM(model, device="cpu", parallel=2).generate(prompts, params)
    record = tmp_path / "record.jsonl"
    OracleDrafter.write_record(record, [(p_ids, o.token_ids) for p_ids, o in zip(prompts, want)])
    llm = LLM(model, device="cpu", parallel=2, speculative=oracle_speculation(p, record, policy="always"))
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    e = llm.engine
    assert e.spec_proposed > 0
    assert e.spec_accepted == (e.spec_proposed if p == 1.0 else 0)


def test_oracle_cannot_be_enabled_by_accident(capsys):
    from onebit.cli import main
    for args, message in ((["--draft", "oracle:0.5"], "needs --draft-record"),
                          (["--draft", "oracle:1.5", "--draft-record", "x"], "oracle:P with P in [0, 1]"),
                          (["--draft", "mtp", "--draft-record", "x"], "the only value is oracle:P"),
                          (["--draft-record", "x"], "belongs to --draft oracle:P"),
                          (["--draft", "oracle:0.5", "--draft-record", "x", "--ngram"], "two drafters")):
        assert main(["serve", *args]) == 1
        assert message in capsys.readouterr().err
    from onebit.bench.oracle import oracle_speculation
    with pytest.raises(ValueError, match="measuring instrument"):
        LLM(str(default_model_dir()), device="cpu", speculative="oracle")
    with pytest.raises(ValueError, match="measuring instrument"):
        LLM(str(default_model_dir()), device="cpu", speculative=oracle_speculation(0.5, None))


@pytest.mark.parametrize("speculative", ["mtp", "ngram"])
def test_batch_of_8_with_per_request_n_max_is_lossless(speculative):
    """Eight requests decoding together, each with its own draft_max (None, 0..3), as in the draft-model test."""
    prompts = PROMPTS * 2
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, draft_max=p.draft_max)
              for p in DRAFT_PARAMS]
    want = LLM(str(default_model_dir()), device="cpu", parallel=8).generate(prompts, params)
    llm = _always_draft(LLM(str(default_model_dir()), device="cpu", parallel=8, speculative=speculative))
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.engine.spec_proposed > 0
    bm = llm.engine.scheduler.blocks
    assert bm.num_free == bm.num_blocks and not llm.engine.has_unfinished()


def test_mtp_on_a_checkpoint_without_a_head_fails_clearly(tiny_model_dir):
    import subprocess
    import sys

    from onebit.models.errors import ModelLoadError
    with pytest.raises(ModelLoadError, match="has no multi-token-prediction head"):
        LLM(str(tiny_model_dir), device="cpu", speculative="mtp")
    done = subprocess.run([sys.executable, "-m", "onebit.cli", "serve", "-m", str(tiny_model_dir), "--mtp",
                           "--device", "cpu", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "has no multi-token-prediction head" in done.stderr


def test_kv_budget_reported_for_restarts_covers_the_mtp_layer(tiny_models):
    """A restarted backend is pinned to the bytes its first load reported; with an MTP layer (or a
    draft pool) in every block, those bytes must buy the same number of blocks again."""
    from onebit.backends.native_worker import _kv_info
    from onebit.testing.tiny import make_tiny_model
    path = make_tiny_model(tiny_models("qwen3").parent / "kv-mtp", arch="qwen3", mtp=True)
    first = LLM(str(path), device="cpu", speculative="mtp", kv_cache_memory=3 << 20).engine
    info = _kv_info(first)
    again = LLM(str(path), device="cpu", speculative="mtp", kv_cache_memory=info["kv_cache_bytes"]).engine
    assert again.scheduler.num_blocks == first.scheduler.num_blocks == info["kv_cache_blocks"]


def test_min_tokens_bans_end_tokens_in_verification_rows_before_the_minimum():
    """A request with min_tokens drafts, and verification bans end tokens per row exactly as plain
    sampling would at that position: row j follows j drafts."""
    from onebit.engine.spec.speculator import Speculator
    eos = 0
    spec = Speculator(drafter=None, eos_token_ids={eos})
    spec.policy = DraftPolicy(3)
    logits = torch.full((4, 10), -5.0)
    logits[0, 5] = 3.0           # row 0: the first draft (5) is the argmax
    logits[1, eos], logits[1, 4] = 3.0, 2.0   # row 1: end token first, 4 second
    logits[2, eos], logits[3, eos] = 3.0, 3.0
    for min_tokens, want in ((3, ([5, 4], 1)), (2, ([5, 4], 1)), (1, ([5, eos, eos], 2)), (0, ([5, eos, eos], 2))):
        seq = Sequence("x", [1, 2], SamplingParams(temperature=0, min_tokens=min_tokens), 100, 0)
        seq.token_ids.extend([5, eos, 7])
        seq.num_draft = 3
        assert spec.verify(seq, logits.clone()) == want, min_tokens


def test_min_tokens_no_longer_stops_drafting(tmp_path):
    """A fixed-length request (min_tokens = max_tokens, as `1bit bench` sends) drafts, losslessly."""
    from onebit.bench.oracle import OracleDrafter, oracle_speculation
    prompts = [[10, 20, 30, 40], [7, 8, 9]]
    params = SamplingParams(temperature=0, max_tokens=20, min_tokens=20, ignore_eos=True)
    model = str(default_model_dir())
    want = LLM(model, device="cpu", parallel=2).generate(prompts, params)
    record = tmp_path / "record.jsonl"
    OracleDrafter.write_record(record, [(p_ids, o.token_ids) for p_ids, o in zip(prompts, want)])
    llm = LLM(model, device="cpu", parallel=2, speculative=oracle_speculation(1.0, record, policy="always"))
    assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in want]
    assert llm.engine.spec_proposed > 0 and llm.engine.spec_accepted == llm.engine.spec_proposed


def test_above_the_adaptive_limit_the_primary_share_keeps_drafting(tiny_model_dir):
    """One-device `--adaptive`: above adaptive_at running requests, the first adaptive_at still draft
    (the primary's share) and the rest take plain rows, never more drafting rows than the limit;
    greedy output stays the plain engine's."""
    prompts = [[5 + i, 6, 7, 5 + i, 6, 7, 5 + i, 6, 7, 5 + i, 6] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = LLM(str(tiny_model_dir), device="cpu", parallel=6).generate(prompts, params)
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=6, adaptive_at=2,
              speculative={"method": "ngram", "policy": "always"})
    spec, seen = llm.engine.speculator, []
    propose = spec.propose

    def counting(scheduler):
        drafting, chose = propose(scheduler)
        seen.append((len(scheduler.running), len(drafting)))
        return drafting, chose
    spec.propose = counting
    assert [o.token_ids for o in llm.generate(prompts, params)] == [o.token_ids for o in want]
    assert max(drafting for _, drafting in seen) <= 2
    assert any(running > 2 and drafting > 0 for running, drafting in seen)


def test_policy_weighs_drafts_by_the_share_that_drafts():
    """With 1 of 64 decodes drafting, a draft step that costs 1.5x a plain one does not pay; with all
    64 drafting at 90% acceptance it does."""
    policy = DraftPolicy(2)
    policy.acceptance = 0.9
    b = policy.bucket(64)
    policy.times.update({(0, b): 1.0, (1, b): 1.5, (2, b): 1.5})
    assert policy.choose(64, drafting=1) == 0
    assert policy.choose(64) == 2


def _simulate_policy(policy: DraftPolicy, steps: int, drafting: int, batch: int, step_ms: dict[int, float],
                     ramp_steps: int = 0, ramp_factor: float = 1.0, mixed_share: float = 0.0,
                     mixed_ms: float = 0.0) -> list[int]:
    """Drive the policy as the overlapped engine does, with given step costs (no clock): a plain step
    after a drafting one starts cold, the plain step before a drafting one is done with no launch
    behind it, and neither is a steady time; plain steps of the first `ramp_steps` cost
    `ramp_factor` times more (a level's start, prefills riding along); a share `mixed_share` of the
    steps, drawn with a fixed seed, carries a prompt chunk (closed-loop turnover) that costs
    `mixed_ms` more whatever k is. Returns the choices."""
    turnover = random.Random(0)
    choices, pending = [], None  # pending: (seconds, cold, mixed) of the plain step still in flight
    for i in range(steps):
        k = policy.choose(batch, drafting=drafting)
        if pending is not None:
            seconds, cold, was_mixed = pending
            followed = k == 0  # a drafting step first waits for the step in flight
            policy.record_step(batch, 0, seconds if followed else seconds / 4, steady=followed and not cold,
                               mixed=was_mixed)
            pending = None
        mixed = turnover.random() < mixed_share
        extra = mixed_ms if mixed else 0.0
        if k:
            policy.record_step(batch, k, (step_ms[k] + extra) / 1e3, mixed=mixed)
        else:
            scale = ramp_factor if i < ramp_steps else 1.0
            pending = ((step_ms[0] * scale + extra) / 1e3, bool(choices) and choices[-1] > 0, mixed)
        choices.append(k)
    return choices


def test_policy_dynamics_at_one_request_and_at_64():
    """Counts, not clocks: with the H200's step costs (G14, session 9), one request drafts nearly
    every step, and at 64 requests with 8 drafting rows (plain 10% faster) drafting fades after a
    level start that made plain steps look slow: the plain estimate is re-measured while drafting
    (it froze before 01d3b33, and 64 requests ran at 0.87x)."""
    one = DraftPolicy(3)
    one.acceptance = 0.75
    choices = _simulate_policy(one, 1000, drafting=1, batch=1, step_ms={0: 5.3, 1: 5.4, 2: 5.5, 3: 5.6})
    assert sum(k == 3 for k in choices[100:]) >= 0.9 * 900
    many = DraftPolicy(3)
    many.acceptance = 0.75
    choices = _simulate_policy(many, 1000, drafting=8, batch=64, step_ms={0: 7.8, 1: 8.6, 2: 9.5, 3: 10.5},
                               ramp_steps=40, ramp_factor=1.5)
    assert any(choices[:200])  # the ramp made drafting look worth it...
    assert sum(k > 0 for k in choices[400:]) <= 0.05 * 600  # ...and the re-measured plain time ended it


@pytest.mark.parametrize("mixed_share", [0.2, 0.5, 0.8])
def test_policy_compares_like_with_like_under_turnover(mixed_share):
    """Counts, not clocks: at 64 closed-loop streams a prompt chunk rides along every few steps
    (G23, session 10: +2.2 ms on a 5.7 ms step, at random steps). Plain steps are re-measured one at a time while
    drafting goes on, so when a turnover step's time stood in for the plain estimate, plain looked
    slower than it is and 8 drafting rows of 64 kept drafting (G14, session 10: 0.86x of
    `--parallel 64`). With plain 10% faster in steady steps, drafting must fade all the same."""
    policy = DraftPolicy(3)
    policy.acceptance = 0.75
    choices = _simulate_policy(policy, 2000, drafting=8, batch=64, step_ms={0: 7.8, 1: 8.6, 2: 9.5, 3: 10.5},
                               ramp_steps=40, ramp_factor=1.5, mixed_share=mixed_share, mixed_ms=2.2)
    assert sum(k > 0 for k in choices[1000:]) <= 0.06 * 1000
    # ...and where drafting does pay (one request, every third step carrying a chunk), it stays on.
    one = DraftPolicy(3)
    one.acceptance = 0.75
    choices = _simulate_policy(one, 2000, drafting=1, batch=1, step_ms={0: 5.3, 1: 5.4, 2: 5.5, 3: 5.6},
                               mixed_share=mixed_share, mixed_ms=2.2)
    assert sum(k == 3 for k in choices[1000:]) >= 0.9 * 1000
