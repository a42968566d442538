"""`onebit.kernels.l2_prefetch`: which tensors a module's prefetch asks for and when, how many programs
cover a tensor (CPU); on a Hopper GPU, that products around a prefetch, eager and replayed from a CUDA
graph, give the same bits as without. The kernel is PTX the interpreter cannot run (compiled for sm_90
in tests/test_triton_sm90_compile.py)."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels import l2_prefetch
from onebit.models.layers import Linear
from onebit.models.quantize import Fp8Linear

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def _ptrs(tensors):
    return [t.data_ptr() for t in tensors]


def test_large_tensors_are_the_weights_not_the_bias_or_the_scales():
    linear = Linear(1024, 512, bias=True)  # 2 MB of float32 weight, a 2 KB bias
    assert _ptrs(l2_prefetch.large_tensors(linear)) == [linear.weight.data_ptr()]
    fp8 = Fp8Linear(torch.zeros(1024, 1024, dtype=torch.float8_e4m3fn), torch.ones(1024), None)
    assert _ptrs(l2_prefetch.large_tensors(fp8)) == [fp8.qweight.data_ptr()]
    assert l2_prefetch.large_tensors(Linear(16, 16, bias=False)) == []


def test_programs_cover_every_byte_and_no_more_than_one_program_beyond():
    per_program = l2_prefetch.CHUNK * l2_prefetch.BLOCK
    for nbytes in (16, l2_prefetch.CHUNK, per_program + 16, 33_554_432, 1_244_659_712):
        count = l2_prefetch.programs(nbytes)
        assert count * per_program >= nbytes > (count - 1) * per_program
    assert l2_prefetch.programs(4096 * 4096 * 2, 4 << 10) == 64


def test_the_prefetch_is_wanted_only_while_enabled_at_few_rows_for_tensors_it_can_take(monkeypatch):
    linear = Linear(1024, 512, bias=False)
    monkeypatch.setattr(l2_prefetch, "enabled", True)
    assert l2_prefetch.wanted(linear, 1) == []  # a CPU weight: nothing to launch
    monkeypatch.setattr(l2_prefetch, "can_prefetch", lambda tensor: True)
    assert _ptrs(l2_prefetch.wanted(linear, 1)) == _ptrs(l2_prefetch.wanted(linear, l2_prefetch.MAX_ROWS)) \
        == [linear.weight.data_ptr()]
    assert l2_prefetch.wanted(linear, l2_prefetch.MAX_ROWS + 1) == []
    monkeypatch.setattr(l2_prefetch, "enabled", False)
    assert l2_prefetch.wanted(linear, 1) == []


def test_during_runs_the_block_untouched_on_the_cpu(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "enabled", True)
    ran = []
    with l2_prefetch.during(Linear(1024, 512, bias=False), 1):
        ran.append("block")
    assert ran == ["block"] and not l2_prefetch.can_prefetch(torch.zeros(1 << 20))


@pytest.mark.skipif(not ON_HOPPER, reason="cp.async.bulk.prefetch needs a Hopper GPU")
def test_products_around_a_prefetch_are_bit_for_bit_the_same_eager_and_in_a_graph():
    torch.manual_seed(0)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    want = x @ w.T
    with l2_prefetch.prefetching([w]):
        y = torch.relu(x) * 2  # stands in for the attention window
    assert torch.equal(x @ w.T, want) and torch.equal(y, torch.relu(x) * 2)
    graph, out = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        with l2_prefetch.prefetching([w, w[:2048]]):
            mid = x * 1
        out = mid @ w.T
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


def test_the_device_script_can_switch_the_prefetch_on():
    """bench/gpu_l2_prefetch.sh makes its "on" side by rewriting the line `enabled = False ...`."""
    from pathlib import Path

    source = Path(l2_prefetch.__file__).read_text()
    assert sum(line.startswith("enabled = False ") for line in source.splitlines()) == 1
    assert "s/^enabled = False /enabled = True /" in (Path(__file__).parents[1] / "bench/gpu_l2_prefetch.sh").read_text()
