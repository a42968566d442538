"""Modes "f16" and "f16s" of the packed GGUF products (`triton_gguf_f16`): x's float16 preparation and
the products against their float64 references (Triton's interpreter on CPU, the GPU where there is
one), for Q4_K and Q5_K, and Q6_K in "f16s"; rows with values past float16's range; the types the
modes refuse."""

from __future__ import annotations

import math

import pytest
import torch

from onebit.kernels.gguf_repack import (F16Rows, RepackedMatrix, prepare_x_f16_ref, repacked_f16_linear_ref,
                                       repacked_f16s_q6_k_linear_ref, repacked_linear_ref)
from tests.test_gguf_kernels import random_blocks

tr = pytest.importorskip("onebit.kernels.triton_gguf_repacked")
tf = pytest.importorskip("onebit.kernels.triton_gguf_f16")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _weight(qtype: str, rows: int, cols: int, seed: int) -> RepackedMatrix:
    raw = torch.from_numpy(random_blocks(qtype, rows, cols, seed, d_scale=0.01))
    return RepackedMatrix.from_blocks(raw, qtype, cols).to(DEVICE)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want.double().cpu()).norm() / want.double().cpu().norm()).item()


def _x(rows: int, seed: int) -> torch.Tensor:
    """Random rows with one far past float16's range (1e6) and one all zeros."""
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(seed))
    x[1] *= 1e6
    x[2] = 0.0
    return x


def test_prepare_x_is_its_reference_with_a_power_of_two_scale_per_row():
    x = _x(5, seed=1)
    x16, xm, xe = tf.prepare_x(x.to(DEVICE))
    r16, rm, re = prepare_x_f16_ref(x)
    assert x16.dtype == xm.dtype == torch.float16 and xe.dtype == torch.float32
    assert torch.equal(x16.float().cpu(), r16) and torch.equal(xe.cpu(), re)
    assert (xm.float().cpu() - rm).abs().max().item() <= 2.0**-10 * rm.abs().max().item()  # a float16 step at most
    assert xe[0].item() == 1.0 and xe[2].item() == 1.0  # ordinary and zero rows: unscaled
    top = x[1].abs().max().item()  # about 3e6: 2**21 -> a scale of 2**7
    assert xe[1].item() == 2.0 ** (math.floor(math.log2(top)) - 14) and 2.0**14 <= x16[1].abs().max().item() < 2.0**15
    assert torch.isfinite(x16.float()).all()
    with pytest.raises(ValueError, match="multiple of 256"):
        tf.prepare_x(torch.zeros(1, 300, device=DEVICE))


# (rows, config): the split-K sum and the atomic add, one program along K, tiles past the weight's
# end (N = 40), a full 64-row tile.
CASES = [(5, tr.RepackedConfig("f16", 32, 1, split=2)), (20, tr.RepackedConfig("f16", 64, 1, split=1, reduce="atomic")),
         (tr.MAX_INT_ROWS, tr.RepackedConfig("f16", 16, 1, split=2)),
         (5, tr.RepackedConfig("f16s", 32, 1, split=2)), (20, tr.RepackedConfig("f16s", 64, 1, split=1, reduce="atomic")),
         (tr.MAX_INT_ROWS, tr.RepackedConfig("f16s", 16, 1, split=2))]


@pytest.mark.parametrize("qtype", tr.F16_TYPES)
def test_f16_modes_match_their_reference(qtype):
    """"f16" keeps the weights exact: only float32 sums separate it from the float64 reference. "f16s"
    rounds each weight (d * scale * code) once to float16, 2**-11 relative at most, so its products
    stay within ~1e-3 of it. Both stay near the exact product despite the 1e6 row (scaled by 2**-6)."""
    w = _weight(qtype, 40, 512, seed=len(qtype))
    for m, config in CASES:
        x = _x(m, seed=m)
        want = repacked_f16_linear_ref(x.double(), w.to("cpu"))
        got = tr.matmul_few_rows(x.to(DEVICE), w, config=config).float()
        assert torch.isfinite(got).all(), (m, config)
        assert _rel(got, want) < (1e-5 if config.mode == "f16" else 2e-3), (m, config, _rel(got, want))
        exact = repacked_linear_ref(x.double(), w.to("cpu"))
        assert _rel(got, exact) < 3e-3, (m, config)
        assert _rel(got[1:2], exact[1:2]) < 3e-3, (m, config)  # the scaled row on its own


def test_f16s_takes_q6_k_with_its_weights_rounded_to_float16():
    """Q6_K's weights float16(float16(d * scale) * (code - 32)): the kernel matches that float64
    reference up to float32 sums, and stays near the exact product (weights rounded to 11 bits, x to
    float16), the 1e6 row included. The launches: the split-K sum, the atomic add, a 64-row tile."""
    w = _weight("Q6_K", 40, 512, seed=6)
    for m, config in CASES[3:]:
        x = _x(m, seed=m)
        want = repacked_f16s_q6_k_linear_ref(x.double(), w.to("cpu"))
        got = tr.matmul_few_rows(x.to(DEVICE), w, config=config).float()
        assert torch.isfinite(got).all(), (m, config)
        assert _rel(got, want) < (1e-5 if DEVICE == "cpu" else 4e-3), (m, config, _rel(got, want))
        exact = repacked_linear_ref(x.double(), w.to("cpu"))
        assert _rel(got, exact) < 3e-3, (m, config)
        assert _rel(got[1:2], exact[1:2]) < 3e-3, (m, config)
    # the reference itself: off the exact product by the weights' and x's rounding, not more
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2)).double()
    exact = repacked_linear_ref(x, w.to("cpu"))
    assert 0 < _rel(repacked_f16s_q6_k_linear_ref(x, w.to("cpu")), exact) < 2e-3
    with pytest.raises(ValueError, match="Q6_K's, not Q4_K's"):
        repacked_f16s_q6_k_linear_ref(x, _weight("Q4_K", 16, 512, seed=1).to("cpu"))


def test_f16_reference_is_off_the_exact_product_by_the_rounding_of_x():
    """x already in float16 (and in range): the only rounding left is the sub-block means', so the
    reference is within float16's step of the exact product; with bfloat16 x there is more."""
    w = _weight("Q4_K", 24, 512, seed=5)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(9)).half().double()
    exact = repacked_linear_ref(x, w.to("cpu"))
    ref = repacked_f16_linear_ref(x, w.to("cpu"))
    assert 0 < _rel(ref, exact) < 2.0**-10


def test_f16_modes_refuse_other_types():
    x = torch.randn(8, 512).to(DEVICE)
    with pytest.raises(ValueError, match='mode "f16s" takes Q4_K, Q5_K, Q6_K, not Q8_0'):
        tr.matmul_few_rows(x, _weight("Q8_0", 16, 512, seed=1), config=tr.RepackedConfig("f16s", 32, 1))
    for qtype in ("Q6_K", "Q8_0"):  # "f16" keeps weights exact: only 4- and 5-bit codes fit
        with pytest.raises(ValueError, match='mode "f16" takes Q4_K, Q5_K, not'):
            tr.matmul_few_rows(x, _weight(qtype, 16, 512, seed=1), config=tr.RepackedConfig("f16", 32, 1))
    with pytest.raises(ValueError, match="Q4_K and Q5_K"):
        repacked_f16_linear_ref(x.cpu(), _weight("Q8_0", 16, 512, seed=1).to("cpu"))


# bfloat16 on the GPU only: Triton's interpreter rounds float32 to bfloat16 by truncation.
NORM_DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32


@pytest.mark.parametrize("cols", [512, 768])  # 768: a row shorter than the kernel's power-of-two block
def test_the_input_norm_prepares_its_rows_as_prepare_x_does(cols):
    """`add_rms_norm_f16`: the normalized rows and the residual sum bit for bit `add_rms_norm`'s, and
    their float16 copy, means and scale bit for bit `prepare_x`'s of those rows; a norm weight of 1e5
    on some columns pushes rows past float16's range (scale > 1)."""
    from onebit.kernels import triton_fused

    g = torch.Generator().manual_seed(cols)
    x, residual = (torch.randn(4, cols, generator=g).to(DEVICE, NORM_DTYPE) for _ in range(2))
    weight = torch.randn(cols, generator=g)
    weight[:7] = 1e5
    weight = weight.to(DEVICE, NORM_DTYPE)
    for res in (residual, None):
        rows, summed = tf.add_rms_norm_f16(x, res, weight, 1e-6)
        want, want_sum = triton_fused.add_rms_norm(x, res, weight, 1e-6)
        assert isinstance(rows, F16Rows) and torch.equal(rows.x, want)
        assert (summed is None) == (res is None) and (res is None or torch.equal(summed, want_sum))
        for got, expect in zip(rows[1:], tf.prepare_x(want)):
            assert got.dtype == expect.dtype and torch.equal(got, expect)
        assert rows.xe.max().item() > 1.0  # the 1e5 columns: scaled down by a power of two
    with pytest.raises(ValueError, match="multiple of 256"):
        tf.add_rms_norm_f16(torch.zeros(1, 300, device=DEVICE), None, torch.ones(300, device=DEVICE), 1e-6)


def test_prepared_rows_give_every_mode_the_same_numbers():
    """A product handed `F16Rows` computes what it computes from their x: modes "f16s" and "f16" read
    the preparation, "int" reads x; through `packed_linear` with parts of both kinds too."""
    from onebit.kernels import gguf_quants

    x = torch.randn(20, 512, generator=torch.Generator().manual_seed(4)).to(DEVICE, NORM_DTYPE)
    rows = F16Rows(x, *tf.prepare_x(x))
    for qtype, config in (("Q4_K", tr.RepackedConfig("f16s", 32, 1, split=2)), ("Q6_K", tr.RepackedConfig("f16s", 32, 1)),
                          ("Q4_K", tr.RepackedConfig("f16", 64, 1)), ("Q6_K", tr.RepackedConfig("int", 32, 1, split=2))):
        w = _weight(qtype, 40, 512, seed=3)
        assert torch.equal(tr.matmul_few_rows(rows, w, config=config), tr.matmul_few_rows(x, w, config=config)), config
    parts = [_weight("Q4_K", 32, 512, seed=1), _weight("Q6_K", 16, 512, seed=2)]
    assert torch.equal(gguf_quants.packed_linear(rows, parts, kernels=True), gguf_quants.packed_linear(x, parts, kernels=True))
    assert torch.equal(gguf_quants.packed_linear(rows, parts, kernels=False), gguf_quants.packed_linear(x, parts, kernels=False))
