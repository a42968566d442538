"""The CUDA-graph decode path's static inputs and padding, checked eagerly on CPU.

Graph capture needs a GPU, but what a replay computes is `_forward` over the static
buffers; running that eagerly must give the runner's ordinary logits for the real rows.
"""

from __future__ import annotations

import torch

from onebit import LLM, SamplingParams
from onebit.engine.cuda_graphs import CudaGraphDecoder, ladder_for


def test_ladder_covers_every_batch():
    assert ladder_for(1) == [1]
    sizes = ladder_for(100)
    assert sizes[-1] == 100 and sizes == sorted(sizes)
    assert all(any(s >= b for s in sizes) for b in range(1, 101))


def test_static_decode_inputs_reproduce_eager_logits(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=8, block_size=4, enable_prefix_caching=False)
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    for i, n in enumerate([3, 9, 14]):
        engine.add_request(f"r{i}", list(range(20 + i, 20 + i + n)), params)
    for _ in range(4):  # prefill, then a few decodes
        engine.step()
    plan = [(seq, 1) for seq in engine.scheduler.running]
    for seq, _ in plan:
        engine.block_manager.grow(seq, seq.num_tokens)
    eager = runner.run(plan).logits
    graphs = CudaGraphDecoder(runner.model, runner.kv_cache, runner.rope, engine.block_manager.num_blocks,
                              runner.block_size, max_batch=8, max_blocks=-(-engine.max_model_len // 4),
                              num_splits=1, max_context=engine.max_model_len)
    seqs = [seq for seq, _ in plan]
    pos = [s.num_computed_tokens for s in seqs]
    b = graphs.fill([s.token_ids[p] for s, p in zip(seqs, pos)], pos,
                    [s.block_table[p // 4] * 4 + p % 4 for s, p in zip(seqs, pos)],
                    [s.block_table for s in seqs], [p + 1 for p in pos])
    assert b == 4  # three rows padded to the ladder's 4
    with torch.inference_mode():
        static = graphs._forward(b)
    assert (static[:3] - eager).abs().max().item() < 1e-5
    assert torch.isfinite(static).all()  # the padding row attends to the scratch block, no NaN
