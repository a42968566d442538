"""Overlapped steps: step n+1 is queued before step n's sampled tokens reach the host.

On CPU nothing runs asynchronously, but the bookkeeping is the same as on CUDA: decodes read
their last token (a placeholder on the host) from the previous step's sampled ids on the
device, and every token reaches the host one `step()` later. The output must be exactly
that of plain steps, whatever ends a request (length, a stop token, a stop string, an abort).
"""

from __future__ import annotations

import os

import pytest

from onebit import LLM, SamplingParams
from test_cuda_graph_inputs import emulate_graphs


def _count_feeds(llm: LLM) -> list[int]:
    """Record, per forward, how many rows took their input id from the previous step's tokens."""
    runner, fed = llm.engine.runner, []
    feed = runner._feed

    def spy(plan, fed_tokens):
        result = feed(plan, fed_tokens)
        fed.append(0 if result is None else result.values.numel())
        return result
    runner._feed = spy
    return fed


def _no_leak(llm: LLM) -> None:
    engine = llm.engine
    assert engine.scheduler.blocks.num_free == engine.scheduler.blocks.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert not engine.has_unfinished() and not engine.seqs


def _prompts() -> list[list[int]]:
    return [[(7 * i + 3 * j) % 400 + 10 for j in range(3 + 5 * i)] for i in range(6)]


def _mixed_params(stop_token: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.8, seed=7, max_tokens=20, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=16, min_tokens=16, logit_bias={11: 2.0}),
        SamplingParams(temperature=0.5, seed=3, max_tokens=25, ignore_eos=True),
    ]


def _stop_token(tiny_model_dir) -> int:
    """A token that the second prompt's greedy continuation produces mid-way, to stop on."""
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=1)
    tokens = llm.generate([_prompts()[1]], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].token_ids
    return tokens[len(tokens) // 2]


def _outputs(llm: LLM, params):
    return [(o.token_ids, o.text, o.finish_reason,
             [(lp.token_id, round(lp.logprob, 4)) for lp in o.logprobs] if o.logprobs else None)
            for o in llm.generate(_prompts(), params)]


@pytest.mark.parametrize("graph_rows", [False, True])
def test_overlapped_steps_give_the_plain_steps_output(tiny_model_dir, graph_rows):
    params = _mixed_params(_stop_token(tiny_model_dir))
    plain = LLM(str(tiny_model_dir), device="cpu", parallel=4, block_size=4, overlap=False)
    overlapped = LLM(str(tiny_model_dir), device="cpu", parallel=4, block_size=4, overlap=True)
    if graph_rows:  # the CUDA-graph path's static buffers, run eagerly: fed ids land in the static input
        emulate_graphs(overlapped, chunk=16)
    fed = _count_feeds(overlapped)
    expected = _outputs(plain, params)
    assert expected[1][2] == "stop" and expected[3][0] and len(expected[3][0]) == 1
    assert _outputs(overlapped, params) == expected
    assert sum(fed) > 20, "decodes should have read their input ids from the previous step on the device"
    _no_leak(overlapped)


def test_penalties_wait_for_the_host(tiny_model_dir):
    """A repetition penalty needs the tokens so far on the host: those steps do not overlap."""
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, frequency_penalty=0.5)]
    plain = LLM(str(tiny_model_dir), device="cpu", parallel=2, overlap=False)
    overlapped = LLM(str(tiny_model_dir), device="cpu", parallel=2, overlap=True)
    fed = _count_feeds(overlapped)
    prompts = _prompts()[:2]
    assert ([o.token_ids for o in overlapped.generate(prompts, params)]
            == [o.token_ids for o in plain.generate(prompts, params)])
    assert sum(fed) == 0


def test_abort_while_a_step_is_in_flight(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=3, overlap=True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(_prompts()[:3]):
        engine.add_request(f"r{i}", prompt, params)
    deltas = {f"r{i}": [] for i in range(3)}
    for _ in range(5):
        for d in engine.step():
            deltas[d.request_id].append(d)
    assert engine._inflight is not None  # a step is queued whose tokens the host has not seen
    engine.abort("r1")
    while engine.has_unfinished():
        for d in engine.step():
            deltas[d.request_id].append(d)
    finals = [d for d in deltas["r1"] if d.finished]
    assert len(finals) == 1 and finals[0].finish_reason == "abort" and deltas["r1"][-1] is finals[0]
    for rid in ("r0", "r2"):
        assert sum(len(d.token_ids) for d in deltas[rid]) == 40 and deltas[rid][-1].finish_reason == "length"
    _no_leak(llm)


def test_a_request_failing_in_the_sampler_leaves_the_others_fed_right(tiny_model_dir):
    """When one row of a step fails to sample, the others are sampled without it, so their tokens
    sit at other rows than their logits: the next step must feed each request its own token."""
    from onebit.engine.fault_injection import Fault, FaultInjector
    prompts = _prompts()[:4]
    users = ["ok", "bad", "ok", "ok"]  # a middle row fails: the rows after it move up
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = LLM(str(tiny_model_dir), device="cpu", parallel=4, overlap=False).generate(prompts, params)
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4, overlap=True)
    engine = llm.engine
    engine.faults = FaultInjector([Fault("sampler", "bad", 3)])
    fed = _count_feeds(llm)
    for i, (prompt, user) in enumerate(zip(prompts, users)):
        engine.add_request(f"r{i}", prompt, params, user=user)
    got = {f"r{i}": ([], None) for i in range(4)}
    while engine.has_unfinished():
        for d in engine.step():
            got[d.request_id] = (got[d.request_id][0] + d.token_ids, d.finish_reason)
    tokens, reason = got["r1"]  # it fails once the host has seen 3 tokens, which overlap may delay by one
    assert reason == "error" and 2 <= len(tokens) <= 3 and tokens == want[1].token_ids[:len(tokens)]
    assert [got[f"r{i}"] for i in (0, 2, 3)] == [(want[i].token_ids, "length") for i in (0, 2, 3)]
    assert sum(fed) > 0
    _no_leak(llm)

def test_plain_steps_overlap_beside_drafting_steps(tiny_models):
    """With a drafter, the steps the policy keeps plain overlap and the drafting ones wait for the
    tokens before them: the greedy output stays that of plain steps (the MTP head's states too,
    which it takes from the non-overlapped steps)."""
    model = str(tiny_models("qwen3", mtp=True))
    prompts = [[(11 * i + 5 * j) % 300 + 40 for j in range(6 + 3 * i)] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(model, device="cpu", parallel=3, overlap=False).generate(prompts, params)
    llm = LLM(model, device="cpu", parallel=3, overlap=True, speculative="mtp")
    assert llm.engine.overlap
    policy, calls = llm.engine.speculator.policy, []

    def runs_of_four(batch, drafting=None):  # the measured policy would depend on timing
        calls.append(batch)  # four drafting steps, four plain ones, ...: the head drafts from the
        return policy.k_max if len(calls) // 4 % 2 else 0  # second of a run on (it needs fresh states)
    policy.choose = runs_of_four
    fed = _count_feeds(llm)
    seen = _check_drafting_invariants(llm)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert llm.engine.spec_proposed > 0, "the drafting steps should have drafted"
    assert sum(fed) > 0, "the plain steps should have read their input ids from the step before"
    assert seen["drafting"] > 0 and seen["plain"] > 0 and seen["k>0 timed"] > 0
    _no_leak(llm)


def _check_drafting_invariants(llm: LLM) -> dict[str, int]:
    """Spy on the engine so that every step checks what overlap beside a drafter relies on: a
    drafting step is launched only with nothing in flight (drafts come from the host's tokens),
    no forward mixes drafts with placeholders or fed ids, no drafting step is left in flight, and
    the policy times each step under the draft length chosen at its launch. Returns counts of what
    was checked, for the caller to assert on."""
    engine, seen = llm.engine, {"drafting": 0, "plain": 0, "k>0 timed": 0}
    launch, update, run = engine._launch, engine._update, engine.runner.run
    record_step, step = engine.speculator.policy.record_step, engine.step
    observed = []

    def launching(previous, deltas):
        assert previous is None or engine.speculator.step_k == 0, "drafting with a step in flight"
        launched = launch(previous, deltas)
        if launched is not None:
            launched.k_at_launch = engine.speculator.step_k
            seen["drafting" if launched.drafting else "plain"] += 1
        return launched

    def running(plan, want_hidden=False, fed_tokens=None):
        drafts = [seq for seq, _ in plan if seq.num_draft]
        placeholders = [seq for seq, _ in plan if seq.fed_row is not None]
        assert not (drafts and (placeholders or fed_tokens is not None)), "drafts beside placeholders"
        return run(plan, want_hidden=want_hidden, fed_tokens=fed_tokens)

    def updating(launched, followed=True):
        observed.append(launched)
        try:
            return update(launched, followed)
        finally:
            observed.pop()

    def recording(batch, k, seconds, steady=True, mixed=False):
        launched = observed[-1]  # a drafting step under its k, a plain-chosen one under 0; a step
        # chosen to draft that got no drafts (stale MTP states) under either
        assert k in (0, launched.k_at_launch), "a step timed under another step's draft length"
        assert k == launched.k_at_launch or not launched.drafting, "a drafting step timed as plain"
        seen["k>0 timed"] += k > 0
        return record_step(batch, k, seconds, steady, mixed)

    def stepping():
        deltas = step()
        assert engine._inflight is None or not engine._inflight.drafting
        return deltas
    engine._launch, engine._update, engine.runner.run = launching, updating, running
    engine.speculator.policy.record_step, engine.step = recording, stepping
    return seen


def test_requests_that_cannot_draft_keep_overlap_beside_a_drafter(tiny_models):
    """Requests that never draft (here: logprobs) do not make the policy choose drafting steps,
    which would wait for the tokens before them and draft nothing: every step stays plain and
    overlaps, and the output (logprobs too) is that of plain steps without a drafter."""
    model = str(tiny_models("qwen3", mtp=True))
    prompts = [[(13 * i + 7 * j) % 300 + 40 for j in range(5 + 4 * i)] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)
    plain = LLM(model, device="cpu", parallel=3, overlap=False)
    llm = LLM(model, device="cpu", parallel=3, overlap=True, speculative="mtp")
    decide, chosen = llm.engine.speculator.decide, []
    llm.engine.speculator.decide = lambda *args: chosen.append(decide(*args)) or chosen[-1]
    fed = _count_feeds(llm)
    assert _outputs_of(llm, prompts, params) == _outputs_of(plain, prompts, params)
    assert chosen and not any(chosen), "no step should have been a drafting one"
    assert sum(fed) > 0, "the steps should have overlapped"
    _no_leak(llm)


def _outputs_of(llm: LLM, prompts, params):
    return [(o.token_ids, o.finish_reason, [(lp.token_id, round(lp.logprob, 4)) for lp in o.logprobs or []])
            for o in llm.generate(prompts, params)]


def test_failures_beside_overlapped_and_drafting_steps_fail_only_their_request(tiny_models):
    """With overlap and a drafter, a request failing in the drafter, the sampler or the detokenizer
    (including when the step before is finished early for a drafting step) ends with an error;
    the others finish with the plain engine's output and nothing leaks."""
    from onebit.engine.fault_injection import Fault, FaultInjector
    model = str(tiny_models("qwen3", mtp=True))
    prompts = [[(17 * i + 3 * j) % 300 + 40 for j in range(5 + 2 * i)] for i in range(5)]
    users = ["drafter", "sampler", "detokenizer", "ok", "ok"]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    want = LLM(model, device="cpu", parallel=5, overlap=False).generate(prompts, params)
    llm = LLM(model, device="cpu", parallel=5, overlap=True, speculative="mtp")
    engine = llm.engine
    engine.faults = engine.speculator.faults = FaultInjector([Fault(place, place, 5) for place in users[:3]])
    policy, calls = engine.speculator.policy, []

    def runs_of_three(batch, drafting=None):  # drafting and plain steps in turn, whatever the timing
        calls.append(batch)
        return policy.k_max if len(calls) // 3 % 2 else 0
    policy.choose = runs_of_three
    seen = _check_drafting_invariants(llm)
    got = {f"r{i}": ([], None, None) for i in range(len(prompts))}
    for i, (prompt, user) in enumerate(zip(prompts, users)):
        engine.add_request(f"r{i}", prompt, params, user=user)
    while engine.has_unfinished():
        for d in engine.step():
            tokens, _, _ = got[d.request_id]
            got[d.request_id] = (tokens + d.token_ids, d.finish_reason, d.error)
    for i, user in enumerate(users):
        tokens, reason, error = got[f"r{i}"]
        if user == "ok":
            assert (tokens, reason, error) == (want[i].token_ids, "length", None)
        else:
            assert reason == "error" and error and len(tokens) < 20, (user, reason, error)
    assert "drafting" in got["r0"][2] and "sampling" in got["r1"][2] and "detokenizer" in got["r2"][2]
    assert seen["drafting"] > 0 and seen["plain"] > 0 and engine.spec_proposed > 0
    _no_leak(llm)


def test_prefix_cache_hits_are_the_same_with_overlap(tiny_model_dir):
    """Blocks filled while a step is in flight are hashed once their tokens are known: later
    requests with the same prefix hit the cache exactly as they do without overlap."""
    shared = [(5 * j) % 300 + 20 for j in range(24)]
    prompts = [shared + [100 + i] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    results = {}
    for overlap in (False, True):
        llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, block_size=4, overlap=overlap)
        first = llm.generate([prompts[0]], params)[0]
        # The first request's output blocks are cached too: a prompt that continues it hits them.
        rest = llm.generate([prompts[1], prompts[0] + first.token_ids[:8] + [7]], params)
        results[overlap] = [(o.token_ids, o.num_cached_tokens) for o in [first, *rest]]
        _no_leak(llm)
    assert results[True] == results[False]
    assert results[True][1][1] == 24 and results[True][2][1] == 32


@pytest.mark.parametrize("overlap", [False, True])
def test_offline_bench_splits_prefill_and_decode_by_first_tokens(tiny_model_dir, overlap):
    """`1bit bench --offline` counts every generated token once; decode starts when all requests
    have their first token, which with overlap arrives one step() later."""
    from onebit.bench.offline import run_offline
    lines = []
    results = run_offline(str(tiny_model_dir), [1, 3], 8, 6, "cpu", "float32", print_fn=lines.append,
                          overlap=overlap)
    assert [r.generated for r in results] == [8, 24]
    assert all(r.decode_s > 0 and r.prefill_s > 0 for r in results)
    # Decode counts every token after the first of each request, in both modes.
    assert [round(r.decode_tokens_per_s * r.decode_s) for r in results] == [7, 21]
    assert ("overlapped steps" in lines[0]) == overlap
    assert all(r.gpu_clock is None for r in results) and "GPU clock" not in lines[1]


def test_offline_bench_samples_the_gpu_clock_over_each_batch(tiny_model_dir, tmp_path, monkeypatch):
    """`1bit bench --offline --gpu-clocks INDEX`: each batch's row ends with that GPU's clock (a fake
    nvidia-smi here), in its result too."""
    from onebit.bench.cli import main as bench_main
    from onebit.bench.offline import run_offline
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\nprintf '1980, 300, 0x0\\n'\nexec sleep 60\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    lines = []
    results = run_offline(str(tiny_model_dir), [1, 2], 4, 6, "cpu", "float32", print_fn=lines.append, gpu_clocks=0)
    assert lines[1].endswith("| GPU clock |") and lines[2].endswith("---|")
    assert [r.gpu_clock["samples"] for r in results] == [1, 1]
    assert all(line.endswith("| 1,980 MHz (min 1,980), 300 W, slowed 0% |") for line in lines[3:5])
    assert bench_main(["--offline", "-m", str(tiny_model_dir), "--batch", "1", "--max-tokens", "3",
                       "--prompt-tokens", "4", "--device", "cpu", "--dtype", "float32", "--gpu-clocks", "0"]) == 0


def test_overlap_defaults_to_on_for_cuda_only(tiny_model_dir):
    """Left unset, overlap follows the device: off on the CPU, on for CUDA; an explicit choice wins."""
    from onebit.engine.config import EngineConfig

    assert EngineConfig(model=str(tiny_model_dir)).overlap is None
    assert LLM(str(tiny_model_dir), device="cpu", parallel=1).engine.overlap is False
    assert LLM(str(tiny_model_dir), device="cpu", parallel=1, overlap=True).engine.overlap is True
    from onebit.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).overlap is None
    assert parser.parse_args(["serve", "--no-overlap"]).overlap is False
