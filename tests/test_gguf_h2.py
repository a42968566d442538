"""Mode "h2" of the packed GGUF products (`triton_gguf_h2`: Q4_K and Q6_K at one row in float16 pairs):
x's per-slice preparation, the product against its float64 reference for every thread split and
reduction (Triton's interpreter on CPU, the inline-PTX path on a GPU), slices far apart in
magnitude, and the inputs it refuses."""

from __future__ import annotations

import math

import pytest
import torch

from onebit.kernels.gguf_repack import (GROUPING, RepackedMatrix, prepare_x_h2_ref, repacked_h2_linear_ref,
                                        repacked_linear_ref)
from tests.test_gguf_kernels import random_blocks

tr = pytest.importorskip("onebit.kernels.triton_gguf_repacked")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
COLS = 1024  # four Q4_K groups (eight Q6_K groups): slices of 1, 2 or 4 (2, 4 or 8)


def _weight(qtype: str, rows: int, seed: int) -> RepackedMatrix:
    raw = torch.from_numpy(random_blocks(qtype, rows, COLS, seed, d_scale=0.01))
    return RepackedMatrix.from_blocks(raw, qtype, COLS).to(DEVICE)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want.double().cpu()).norm() / want.double().cpu().norm()).item()


def _x(seed: int) -> torch.Tensor:
    """One row of bf16 values (as float32) whose four groups differ in magnitude: ordinary, 1e6 times
    larger, all zero, 1e-6."""
    x = torch.randn(1, COLS, generator=torch.Generator().manual_seed(seed))
    x[0, 256:512] *= 1e6
    x[0, 512:768] = 0.0
    x[0, 768:] *= 1e-6
    return x.to(torch.bfloat16).float()


def test_prepare_x_h2_scales_each_slice_by_a_power_of_two_into_its_window():
    x = _x(seed=1)
    x16, xsum, scale = prepare_x_h2_ref(x, groups_per_slice=1)
    assert scale.shape == (4,) and x16.shape == (1, COLS) and xsum.shape == (1, COLS // 32)
    for s in range(4):
        part = x16[0, 256 * s:256 * (s + 1)]
        top = part.abs().max().item()
        assert math.log2(scale[s].item()).is_integer()
        if s == 2:
            assert top == 0.0 and scale[s].item() == 2.0**-126
        else:
            assert 2.0**12 <= top < 2.0**13, (s, top)
    # the float16 copy is x times 2**-e rounded once, the sums are the copy's
    back = x16.reshape(4, 256).double() * scale.double()[:, None]
    assert (back - x.double().reshape(4, 256)).abs().max().item() <= 2.0**-11 * x.double().abs().max().item()
    assert torch.allclose(xsum.double(), x16.double().reshape(-1, 32).sum(dim=-1).reshape(1, -1), rtol=1e-6)
    # one slice over all four groups: the 1e6 group sets the scale, the 1e-6 group falls to float16's
    # smallest steps (its share of the product is 1e-12 of the total)
    _, _, one = prepare_x_h2_ref(x, groups_per_slice=4)
    assert one.shape == (1,) and one[0].item() == scale[1].item()


# (type, threads a (row, group), BLOCK_N, split, reduce, stages): every thread split, the split-K sum
# and the atomic add, one slice, a tile past the weight's end (40 rows), several rows a thread
# (BLOCK_N 64 at THREADS 2 on 4 warps), the next group's loads ahead of the arithmetic (stages 2), the
# first group's ahead of x's preparation (0) or neither (1).
CASES = [("Q4_K", 1, 32, 4, "sum", 2), ("Q4_K", 2, 64, 2, "sum", 1), ("Q4_K", 4, 16, 1, "sum", 0),
         ("Q4_K", 8, 16, 2, "atomic", 1), ("Q4_K", 2, 16, 4, "atomic", 2),
         ("Q6_K", 1, 32, 2, "sum", 1), ("Q6_K", 2, 64, 4, "atomic", 2), ("Q6_K", 4, 16, 1, "sum", 0)]


@pytest.mark.parametrize("qtype,threads,block_n,split,reduce,stages", CASES)
def test_h2_matches_its_reference(qtype, threads, block_n, split, reduce, stages):
    """The kernel adds only float16 sums (and for Q6_K each weight's rounding to 11 bits) to the
    reference's rounding of x: within 2e-3 of it (measured 4-9e-4 in the interpreter), and as close to
    the exact product as a bf16 copy of the weights is."""
    w = _weight(qtype, 40, seed=threads)
    x = torch.randn(1, COLS, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).float()
    config = tr.RepackedConfig("h2", block_n, 1, split=split, reduce=reduce, stages=stages, quads=threads)
    got = tr.matmul_few_rows(x.to(DEVICE), w, config=config)  # float32 out: no bf16 rounding on top
    assert got.shape == (1, 40) and got.dtype == torch.float32
    want = repacked_h2_linear_ref(x.double(), w.to("cpu"), COLS // GROUPING[qtype][0] // split)
    exact = repacked_linear_ref(x.double(), w.to("cpu"))
    bf16_weights = x.double() @ w.to("cpu").dequantize(torch.bfloat16).double().T
    assert _rel(got, want) < 2e-3, _rel(got, want)
    assert _rel(got, exact) < max(2e-3, 2 * _rel(bf16_weights, exact)), (_rel(got, exact), _rel(bf16_weights, exact))


@pytest.mark.parametrize("qtype,stages", [("Q4_K", 0), ("Q6_K", 2)])
def test_the_early_first_group_gives_the_same_bits(qtype, stages, monkeypatch):
    """`pdl.early_weights`: the first group's codes and scales loaded before the wait for the previous
    kernel change nothing of the result."""
    from onebit.kernels import pdl

    w = _weight(qtype, 40, seed=3)
    x = torch.randn(1, COLS, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).float().to(DEVICE)
    config = tr.RepackedConfig("h2", 16, 1, split=2, reduce="sum", stages=stages, quads=2)
    plain = tr.matmul_few_rows(x, w, config=config)
    monkeypatch.setattr(pdl, "early_weights", lambda: True)
    assert torch.equal(tr.matmul_few_rows(x, w, config=config), plain)


def test_h2_keeps_slices_of_any_magnitude():
    """Per-slice scales: a slice 1e6 times larger and a zero slice leave the others' products intact."""
    w = _weight("Q4_K", 32, seed=3)
    x = _x(seed=2)
    config = tr.RepackedConfig("h2", 32, 1, split=4, quads=2)
    got = tr.matmul_few_rows(x.to(DEVICE), w, config=config).float().cpu()
    assert torch.isfinite(got).all()
    want = repacked_h2_linear_ref(x.double(), w.to("cpu"), 1)
    assert _rel(got, want) < 2e-3
    small = x.clone()
    small[0, 256:] = 0.0  # the ordinary group alone
    got_small = tr.matmul_few_rows(small.to(DEVICE), w, config=config).float().cpu()
    assert _rel(got_small, repacked_linear_ref(small.double(), w.to("cpu"))) < 2e-3
    as_bf16 = tr.matmul_few_rows(small.to(torch.bfloat16).to(DEVICE), w, config=config)
    assert as_bf16.dtype == torch.bfloat16 and _rel(as_bf16, got_small) < 2.0**-8  # the output's rounding


def test_h2_refuses_other_types_rows_and_splits():
    x = torch.randn(1, COLS).to(torch.bfloat16).to(DEVICE)
    config = tr.RepackedConfig("h2", 32, 1, quads=2)
    for qtype in ("Q8_0", "Q5_K"):
        with pytest.raises(ValueError, match='mode "h2" takes Q4_K, Q6_K'):
            tr.matmul_few_rows(x, _weight(qtype, 16, seed=1), config=config)
    with pytest.raises(ValueError, match="at most 4 threads, not 8"):  # a Q6_K group is 16 words
        tr.matmul_few_rows(x, _weight("Q6_K", 16, seed=1), config=tr.RepackedConfig("h2", 16, 1, quads=8))
    with pytest.raises(ValueError, match='1 to 1 rows in mode "h2"'):
        tr.matmul_few_rows(torch.cat([x, x]), _weight("Q4_K", 16, seed=1), config=config)
    with pytest.raises(ValueError, match='mode "h2" takes Q4_K and Q6_K'):
        repacked_h2_linear_ref(x.cpu(), _weight("Q8_0", 16, seed=1).to("cpu"), 4)


def test_the_register_cap_gives_the_same_bits(monkeypatch):
    """`triton_gguf_h2.CAP_128_REGISTERS` (a launch with Triton's `maxnreg`): the compiler spills instead of
    using more registers, the arithmetic is the same."""
    from onebit.kernels import triton_gguf_h2

    w = _weight("Q4_K", 16, seed=4)
    x = torch.randn(1, COLS, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).float().to(DEVICE)
    config = tr.RepackedConfig("h2", 16, 1, split=2, reduce="sum", stages=0, quads=1)
    plain = tr.matmul_few_rows(x, w, config=config)
    monkeypatch.setattr(triton_gguf_h2, "CAP_128_REGISTERS", True)
    assert torch.equal(tr.matmul_few_rows(x, w, config=config), plain)
