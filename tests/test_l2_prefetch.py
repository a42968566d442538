"""`onebit.kernels.l2_prefetch` on the CPU: which tensors a module's prefetch asks for, when it asks,
and how many programs cover a tensor. The kernel itself is PTX the interpreter cannot run (compiled for
sm_90 in tests/test_triton_sm90_compile.py, timed by bench/gpu_l2_prefetch.py on the device)."""

from __future__ import annotations

import torch

from onebit.kernels import l2_prefetch
from onebit.models.layers import Linear
from onebit.models.quantize import Fp8Linear


def test_large_tensors_are_the_weights_not_the_bias_or_the_scales():
    linear = Linear(1024, 512, bias=True)  # 2 MB of float32 weight, a 2 KB bias
    assert [t.data_ptr() for t in l2_prefetch.large_tensors(linear)] == [linear.weight.data_ptr()]
    fp8 = Fp8Linear(torch.zeros(1024, 1024, dtype=torch.float8_e4m3fn), torch.ones(1024), None)
    assert [t.data_ptr() for t in l2_prefetch.large_tensors(fp8)] == [fp8.qweight.data_ptr()]
    assert l2_prefetch.large_tensors(Linear(16, 16, bias=False)) == []


def test_programs_cover_every_byte_and_no_more_than_one_program_beyond():
    for nbytes in (16, l2_prefetch.CHUNK, l2_prefetch.CHUNK * l2_prefetch.BLOCK + 16, 33_554_432, 1_244_659_712):
        count = l2_prefetch.programs(nbytes)
        per_program = l2_prefetch.CHUNK * l2_prefetch.BLOCK
        assert count * per_program >= nbytes > (count - 1) * per_program
    assert l2_prefetch.programs(4096 * 4096 * 2, 4 << 10) == 64


def test_ahead_asks_for_the_weight_only_at_few_rows_and_while_enabled(monkeypatch):
    asked = []
    monkeypatch.setattr(l2_prefetch, "prefetch", lambda tensor: asked.append(tensor.data_ptr()))
    linear = Linear(1024, 512, bias=False)
    l2_prefetch.ahead(linear, rows=1)
    l2_prefetch.ahead(linear, rows=l2_prefetch.MAX_ROWS)
    l2_prefetch.ahead(linear, rows=l2_prefetch.MAX_ROWS + 1)
    monkeypatch.setattr(l2_prefetch, "enabled", False)
    l2_prefetch.ahead(linear, rows=1)
    assert asked == [linear.weight.data_ptr()] * 2


def test_prefetch_launches_nothing_for_a_cpu_tensor(monkeypatch):
    class Refuse:
        def __getitem__(self, grid):
            raise AssertionError("launched on the CPU")

    monkeypatch.setattr(l2_prefetch, "_prefetch_kernel", Refuse())
    assert l2_prefetch.prefetch(torch.zeros(1 << 20, dtype=torch.bfloat16)) is False
