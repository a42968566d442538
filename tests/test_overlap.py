"""Overlapped steps: step n+1 is queued before step n's sampled tokens reach the host.

On CPU nothing runs asynchronously, but the bookkeeping is the same as on CUDA: decodes read
their last token (a placeholder on the host) from the previous step's sampled ids on the
device, and every token reaches the host one `step()` later. The output must be exactly
that of plain steps, whatever ends a request (length, a stop token, a stop string, an abort).
"""

from __future__ import annotations

import pytest

from onebit import LLM, SamplingParams
from test_cuda_graph_inputs import emulate_graphs


def _count_feeds(llm: LLM) -> list[int]:
    """Record, per forward, how many rows took their input id from the previous step's tokens."""
    runner, fed = llm.engine.runner, []
    feed = runner._feed

    def spy(plan, fed_tokens):
        result = feed(plan, fed_tokens)
        fed.append(0 if result is None else result[0].numel())
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


def test_plain_steps_overlap_beside_drafting_steps():
    """With a drafter, the steps the policy keeps plain overlap and the drafting ones wait for the
    tokens before them: the greedy output stays that of plain steps (the MTP head's states too,
    which it takes from the non-overlapped steps)."""
    from onebit.models.default_model import default_model_dir
    prompts = [[(11 * i + 5 * j) % 300 + 40 for j in range(6 + 3 * i)] for i in range(3)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(str(default_model_dir()), device="cpu", parallel=3, overlap=False).generate(prompts, params)
    llm = LLM(str(default_model_dir()), device="cpu", parallel=3, overlap=True, speculative="mtp")
    assert llm.engine.overlap
    policy, calls = llm.engine.speculator.policy, []

    def runs_of_four(batch, drafting=None):  # the measured policy would depend on timing
        calls.append(batch)  # four drafting steps, four plain ones, ...: the head drafts from the
        return policy.k_max if len(calls) // 4 % 2 else 0  # second of a run on (it needs fresh states)
    policy.choose = runs_of_four
    fed = _count_feeds(llm)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert llm.engine.spec_proposed > 0, "the drafting steps should have drafted"
    assert sum(fed) > 0, "the plain steps should have read their input ids from the step before"
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
