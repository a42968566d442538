"""The mixed-step cap (`--mixed-step-tokens`): while sequences decode, prompt chunks share what the
decode rows leave of the cap, less deep into a long prompt; outputs are unchanged."""

from __future__ import annotations

import random

import pytest

from onebit import LLM, SamplingParams
from onebit.engine.block_manager import BlockManager
from onebit.engine.config import EngineConfig
from onebit.engine.prefill_budget import CONTEXT_SCALE, MIN_CHUNK, chunk_tokens, prefill_tokens
from onebit.engine.scheduler import Scheduler
from onebit.engine.sequence import Sequence


def _seq(i: int, prompt: int) -> Sequence:
    return Sequence(f"r{i}", [1 + t % 50 for t in range(prompt)], SamplingParams(max_tokens=64), 20000, i)


def _decoding(scheduler: Scheduler, count: int) -> list[Sequence]:
    """`count` sequences admitted and past their 3-token prompts: each decodes one token a step."""
    seqs = [_seq(i, 3) for i in range(count)]
    for s in seqs:
        scheduler.add(s)
    plan = scheduler.schedule()
    scheduler.mark_computed(plan)
    for s in seqs:
        scheduler.append(s, 7)
    return seqs


def test_chunk_rule():
    assert prefill_tokens(256, 8) == 248 and prefill_tokens(256, 300) == MIN_CHUNK
    assert chunk_tokens(248, 0) == 248
    assert chunk_tokens(248, CONTEXT_SCALE) == 124  # half the budget at CONTEXT_SCALE tokens in
    assert chunk_tokens(248, 10**6) == MIN_CHUNK  # a very deep chunk still advances
    assert chunk_tokens(8, 10**6) == 8 and chunk_tokens(0, 0) == 0


@pytest.mark.parametrize("cap", [None, 256])
def test_long_prompt_chunks_while_others_decode(cap):
    scheduler = Scheduler(BlockManager(2000, 16), parallel=8, max_batch_tokens=2048, mixed_step_tokens=cap)
    decoding = _decoding(scheduler, 4)
    long = _seq(99, 12000)
    scheduler.add(long)
    chunks = []
    for _ in range(3):
        plan = dict(scheduler.schedule())
        assert all(plan[s] == 1 for s in decoding)  # the decodes always run
        chunks.append(plan[long])
        scheduler.mark_computed(list(plan.items()))
        for s in decoding:
            scheduler.append(s, 7)
    if cap is None:
        assert chunks == [2044] * 3  # the whole step budget
    else:
        left = 256 - 4
        assert chunks[0] == left  # context 0: all the prompt tokens the decode rows leave
        assert chunks[1] == left * CONTEXT_SCALE // (CONTEXT_SCALE + chunks[0])
        assert chunks[0] > chunks[1] > chunks[2]  # fewer the deeper it starts


def test_no_cap_without_decodes_and_prompts_share_the_cap():
    scheduler = Scheduler(BlockManager(2000, 16), parallel=8, max_batch_tokens=2048, mixed_step_tokens=256)
    first, second = _seq(1, 3000), _seq(2, 3000)
    scheduler.add(first)
    scheduler.add(second)
    plan = dict(scheduler.schedule())
    assert plan[first] + plan.get(second, 0) == 2048  # nothing decodes: the plain budget
    scheduler = Scheduler(BlockManager(2000, 16), parallel=8, max_batch_tokens=2048, mixed_step_tokens=256)
    _decoding(scheduler, 2)
    first, second = _seq(1, 3000), _seq(2, 3000)
    scheduler.add(first)
    scheduler.add(second)
    plan = dict(scheduler.schedule())
    assert plan[first] == 254 and second not in plan  # the first takes all 254; the second waits


def test_config_rejects_a_zero_cap():
    with pytest.raises(ValueError, match="mixed_step_tokens"):
        EngineConfig(model="m", mixed_step_tokens=0)


def test_same_tokens_with_the_cap(tiny_model_dir):
    """Greedy and seeded outputs are the same whether long prompts prefill in capped chunks or not."""
    rng = random.Random(3)
    prompts = [[rng.randrange(10, 500) for _ in range(n)] for n in (5, 7, 160, 4, 90)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=8, ignore_eos=True)
              for i in range(len(prompts))]
    outs, steps = {}, {}
    for cap in (None, 24):
        llm = LLM(str(tiny_model_dir), device="cpu", parallel=5, max_batch_tokens=128, mixed_step_tokens=cap,
                  enable_prefix_caching=False)
        outs[cap] = [o.token_ids for o in llm.generate(prompts, params)]
        steps[cap] = llm.engine.runner.eager_steps
    assert outs[24] == outs[None]
    assert steps[24] > steps[None]  # the cap did cut the prompts into more, smaller chunks
