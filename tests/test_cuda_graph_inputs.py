"""The CUDA-graph decode path's static inputs and padding, checked eagerly on CPU.

Graph capture needs a GPU, but what a replay computes is `_forward` over the static
buffers; running that eagerly must give the runner's ordinary logits for the real rows.
"""

from __future__ import annotations

import pytest
import torch

from onebit import LLM, SamplingParams
from onebit.engine.cuda_graphs import CudaGraphDecoder, ladder_for

# The CPU runner's Triton kernels run in the interpreter, which a GPU machine's test run does not turn on.
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton on CPU tensors needs the interpreter")


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
        engine.scheduler.blocks.grow(seq, seq.num_tokens)
    eager = runner.run(plan).logits
    graphs = CudaGraphDecoder(runner.model, runner.kv_cache, runner.rope, engine.scheduler.blocks.num_blocks,
                              runner.block_size, max_batch=8, max_blocks=-(-engine.ctx_size // 4),
                              num_splits=1, max_context=engine.ctx_size)
    seqs = [seq for seq, _ in plan]
    pos = [s.num_computed_tokens for s in seqs]
    b = graphs.fill([s.token_ids[p] for s, p in zip(seqs, pos)], pos,
                    [s.block_table[p // 4] * 4 + p % 4 for s, p in zip(seqs, pos)],
                    [s.block_table for s in seqs], [p + 1 for p in pos])
    assert b == 4  # three rows padded to the ladder's 4
    with torch.inference_mode():
        static, _ = graphs._forward(b)
    assert (static[:3] - eager).abs().max().item() < 1e-5
    assert torch.isfinite(static).all()  # the padding row attends to the scratch block, no NaN


def emulate_graphs(llm: LLM, chunk: int) -> list[int]:
    """Route the engine's steps through CudaGraphDecoder's static buffers, run eagerly (no capture
    on CPU): the same inputs and forward a replay would use. Returns a list that records the row
    count of every step that took that path."""
    engine, runner = llm.engine, llm.engine.runner
    runner.max_graph_chunk = chunk
    runner.graphs = CudaGraphDecoder(runner.model, runner.kv_cache, runner.rope, engine.scheduler.blocks.num_blocks,
                                     runner.block_size, max_batch=engine.config.parallel * chunk,
                                     max_blocks=-(-engine.ctx_size // runner.block_size),
                                     num_splits=runner.num_splits, max_context=engine.ctx_size)
    seen = []
    run = runner.graphs.run

    def spy(ids, *rest, **options):
        seen.append(len(ids))
        return run(ids, *rest, **options)
    runner.graphs.run = spy
    return seen


def _run_staggered(engine, prompts, params) -> dict[str, list[int]]:
    """Two requests start together; the third arrives while they decode (a mixed step)."""
    out: dict[str, list[int]] = {}
    engine.add_request("a", prompts[0], params)
    engine.add_request("b", prompts[1], params)
    for step in range(200):
        if step == 3:
            engine.add_request("c", prompts[2], params)
        for delta in engine.step():
            out.setdefault(delta.request_id, []).extend(delta.token_ids)
        if step > 3 and not engine.has_unfinished():
            break
    return out


def test_prompt_chunks_and_mixed_steps_through_graph_rows_match_eager(tiny_model_dir):
    """Prefill chunks run as graph rows (one row per token), also next to running decodes."""
    from onebit.engine.runner import GRAPH_CHUNK_TOKENS
    prompts = [list(range(30, 47)), list(range(50, 55)), list(range(5, 45))]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want = _run_staggered(LLM(str(tiny_model_dir), device="cpu", parallel=4, block_size=4).engine, prompts, params)
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4, block_size=4)
    seen = emulate_graphs(llm, chunk=GRAPH_CHUNK_TOKENS)
    got = _run_staggered(llm.engine, prompts, params)
    assert got == want
    assert seen[0] == 17 + 5  # the first step: both prompts, one row per token
    assert 2 + 40 in seen  # the mixed step: two decodes and the third prompt
    assert llm.engine.scheduler.blocks.num_free == llm.engine.scheduler.blocks.num_blocks


@pytest.mark.parametrize("speculative", ["mtp", "ngram"])
def test_verification_through_graph_rows_is_lossless(speculative):
    """Verify steps (1 + k rows per sequence) and MTP state collection through the graph path give
    the same greedy tokens as plain eager decoding."""
    from onebit.models.default_model import default_model_dir
    prompts = ["def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\n\ndef f(path):"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    want = LLM(str(default_model_dir()), device="cpu", parallel=3).generate(prompts, params)
    llm = LLM(str(default_model_dir()), device="cpu", parallel=3, speculative={"method": speculative, "draft_max": 3})
    policy = llm.engine.speculator.policy
    policy.choose = lambda batch, drafting=None: policy.k_max  # pin the draft length (the policy times steps)
    seen = emulate_graphs(llm, chunk=4)
    got = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert llm.engine.spec_proposed > 0
    assert any(rows > 3 for rows in seen)  # some step verified drafts as extra rows
    bm = llm.engine.scheduler.blocks
    assert bm.num_free == bm.num_blocks


@CPU_ONLY
def test_eager_warm_up_touches_only_the_scratch_block(tiny_model_dir):
    """The start-up warm-up (run on CUDA to compile the eager kernels) writes no real cache block."""
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, block_size=4)
    runner, blocks = llm.engine.runner, llm.engine.scheduler.blocks.num_blocks
    runner.kv_cache[:, :, :blocks].normal_()
    before = runner.kv_cache[:, :, :blocks].clone()
    runner.warm_up_eager(blocks)
    assert torch.equal(runner.kv_cache[:, :, :blocks], before)
    assert runner.kv_cache[:, :, blocks].abs().sum() > 0  # the scratch block took the writes


@CPU_ONLY
def test_eager_warm_up_compiles_the_long_prompt_flash_launch(tiny_model_dir, monkeypatch):
    """The warm-up's prompts are short, so the flash kernel's launch for many programs (long
    prompts) is run once on its own, in the scratch block, with the engine's dtype and cache."""
    from onebit.kernels import triton_prefill_flash
    llm = LLM(str(tiny_model_dir), device="cpu", parallel=2, block_size=4)
    runner, blocks = llm.engine.runner, llm.engine.scheduler.blocks.num_blocks
    launches = []
    original = triton_prefill_flash.paged_prefill_attention

    def spy(q, k_cache, *args, launch=None, **kwargs):
        launches.append((launch, q.dtype, k_cache.dtype))
        return original(q, k_cache, *args, launch=launch, **kwargs)
    monkeypatch.setattr(triton_prefill_flash, "paged_prefill_attention", spy)
    runner.warm_up_eager(blocks)
    assert (triton_prefill_flash.MANY_PROGRAMS_LAUNCH, torch.float32, runner.kv_cache.dtype) in launches


def test_the_cuda_start_up_runs_its_phases_in_order_over_the_runner_it_builds(tiny_model_dir, monkeypatch, tmp_path):
    """`ModelRunner._start_on_cuda` (only a CUDA device runs it), here on a CPU runner with its GPU parts
    faked: the bf16 calibration over every graph row count, the FP8 calibration where there are FP8
    layers, then the graphs' capture and the eager warm-up, each timed; the report keeps every line.
    A second start with the same inputs restores the choices from the calibration cache, timing nothing."""
    from onebit.engine import runner as runner_module

    llm = LLM(str(tiny_model_dir), device="cpu", parallel=8, block_size=4, enable_prefix_caching=False)
    runner = llm.engine.runner
    calls = []

    class Graphs:
        def __init__(self, model, kv_cache, rope, num_blocks, block_size, rows, max_blocks, splits, ctx):
            assert model is runner.model and kv_cache is runner.kv_cache and block_size == 4 and ctx == runner.ctx_size
            calls.append(("graphs", rows))

        def capture(self):
            calls.append("capture")

    monkeypatch.setattr(runner_module.gemv, "calibrate", lambda layers, rows: calls.append(("bf16", rows)) or ["bf16 line"])
    monkeypatch.setattr(runner_module, "fp8_layers",
                        lambda model: {"layers.0.o": (torch.zeros(4, 8, dtype=torch.float8_e4m3fn), torch.ones(4), None)})
    monkeypatch.setenv("ONEBIT_CALIBRATION_CACHE", str(tmp_path / "calibration"))
    monkeypatch.setattr(runner_module, "fed_layers", lambda model: {})
    monkeypatch.setattr(runner_module.fp8, "calibrate",
                        lambda layers, rows, dtype, fed: calls.append(("fp8", rows)) or ["fp8 line"])
    monkeypatch.setattr(runner_module, "fp8_block_layers", lambda model: {})
    monkeypatch.setattr(runner_module, "CudaGraphDecoder", Graphs)
    monkeypatch.setattr(runner, "warm_up_eager", lambda num_blocks: calls.append("warm-up"))
    runner.dtype = torch.bfloat16  # as a CUDA runner in bf16
    runner._start_on_cuda(llm.engine.scheduler.blocks.num_blocks, calibrate_bf16=True, cuda_graphs=True)
    largest = min(8 * runner.max_graph_chunk, 512)
    assert calls == [("bf16", ladder_for(largest)), ("fp8", [b for b in ladder_for(largest) if b <= runner_module.fp8.MAX_CALIBRATED_ROWS]),
                     ("graphs", largest), "capture", "warm-up"]
    assert runner.gemv_report == ["bf16 line", "fp8 line"] and runner.calibration_source == "timed"
    assert list(runner.startup_s) == ["calibration", "graph capture", "eager warm-up"]
    assert isinstance(runner.graphs, Graphs)
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 1
    calls.clear()
    runner._start_on_cuda(llm.engine.scheduler.blocks.num_blocks, calibrate_bf16=True, cuda_graphs=True)
    assert calls == [("graphs", largest), "capture", "warm-up"]  # nothing timed
    assert runner.gemv_report == ["bf16 line", "fp8 line"] and runner.calibration_source == "cache"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph capture needs a GPU")
def test_captured_replays_match_the_eager_forward(tiny_model_dir):
    """Every captured size replays what `_forward` computes eagerly over the same static inputs (the smaller
    graphs in the largest one's memory pool)."""
    llm = LLM(str(tiny_model_dir), device="cuda", parallel=4, block_size=4, enable_prefix_caching=False)
    runner, num_blocks = llm.engine.runner, llm.engine.scheduler.blocks.num_blocks
    runner.kv_cache.normal_()  # context tokens with finite values, read by both paths alike
    graphs = CudaGraphDecoder(runner.model, runner.kv_cache, runner.rope, num_blocks, runner.block_size,
                              max_batch=4, max_blocks=2, num_splits=1, max_context=8)
    graphs.capture()
    assert sorted(graphs.graphs) == ladder_for(4)
    for rows in (1, 3):
        ids, positions = list(range(7, 7 + rows)), [2] * rows
        slots = [(r % num_blocks) * 4 + 2 for r in range(rows)]
        tables = [[r % num_blocks, num_blocks] for r in range(rows)]
        replayed = [t.clone() for t in graphs.run(ids, positions, slots, tables, [3] * rows)]
        with torch.inference_mode():
            b = graphs.fill(ids, positions, slots, tables, [3] * rows)
            eager = graphs._forward(b)
        for got, want in zip(replayed, eager):
            assert got.shape == want[:rows].shape and torch.isfinite(got).all()
            assert (got.float() - want[:rows].float()).abs().max() <= 1e-2 * want.float().abs().max()


def test_fill_uploads_the_rows_in_one_copy_and_the_table_only_when_it_changed(tiny_model_dir, monkeypatch):
    """`CudaGraphDecoder.fill`: ids, positions, slots and context lengths go up in one upload a step; the block
    table only when its rows (padding included) differ from the last ones uploaded, and the device buffers
    then hold exactly what the step asked for."""
    from onebit.engine import cuda_graphs

    llm = LLM(str(tiny_model_dir), device="cpu", parallel=4, block_size=4, enable_prefix_caching=False)
    runner = llm.engine.runner
    graphs = CudaGraphDecoder(runner.model, runner.kv_cache, runner.rope, 9, runner.block_size, max_batch=4,
                              max_blocks=3, num_splits=1, max_context=12)
    uploads = []
    real = cuda_graphs.upload_into
    monkeypatch.setattr(cuda_graphs, "upload_into", lambda dst, values: (uploads.append(len(values)), real(dst, values)))

    def fill(tables, lens):
        uploads.clear()
        n = len(tables)
        b = graphs.fill(list(range(5, 5 + n)), [x - 1 for x in lens], [t[0] * 4 for t in tables], tables, lens)
        assert graphs.lens[:b].tolist() == lens + [1] * (b - n)
        assert graphs.ids[:n].tolist() == list(range(5, 5 + n))
        width = max(len(t) for t in tables)
        assert graphs.tables[:n, :width].tolist() == [t + [9] * (width - len(t)) for t in tables]
        assert graphs.tables[n:b, :width].tolist() == [[9] * width] * (b - n)  # padding rows: the scratch block
        return len(uploads)

    assert fill([[1], [2, 3]], [3, 6]) == 2  # the rows' buffer, then the table
    assert fill([[1], [2, 3]], [4, 7]) == 1  # the same blocks: only the rows
    assert fill([[1, 4], [2, 3]], [5, 8]) == 2  # a row took a new block
    assert fill([[1], [2, 3]], [3, 6]) == 2  # back to the first table: it is uploaded again
    assert fill([[7]], [2]) == 2  # one row: a smaller ladder size
    assert fill([[7]], [3]) == 1
