"""Split-K products whose last program per tile sums the partials (`triton_split_k.FOLD`) give the
same bits as the reduce kernel, for the gemv and FP8 kernels and every branch of the FP8 one (one
row, tensor-core tiles, e4m3 rows, block scales), and leave their counters at zero (Triton's
interpreter runs the programs one after another, so the last of each tile folds)."""

import pytest
import torch

from onebit.kernels import fp8, triton_fp8_fast, triton_gemv, triton_split_k


class Launches:
    """Stands in for a Triton kernel object and counts its launches (`kernel[grid](...)`)."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


SUM_KERNELS = []


@pytest.fixture
def fold(monkeypatch):
    """FOLD on with a counter buffer of this test's own, the sum kernels' launches counted; returns a
    function giving the buffer."""
    from onebit.kernels import triton_gguf_repacked

    monkeypatch.setattr(triton_split_k, "FOLD", True)
    monkeypatch.setattr(triton_split_k, "_COUNTERS", {})
    SUM_KERNELS[:] = [Launches(triton_split_k._reduce_kernel), Launches(triton_gguf_repacked._sum_splits_kernel)]
    monkeypatch.setattr(triton_split_k, "_reduce_kernel", SUM_KERNELS[0])
    monkeypatch.setattr(triton_gguf_repacked, "_sum_splits_kernel", SUM_KERNELS[1])
    return lambda: triton_split_k._COUNTERS[torch.device("cpu")]


def both_ways(monkeypatch, run):
    """(result with the reduce kernel, result folded twice in a row); checks that the unfolded run
    launched one sum kernel and the folded ones none."""
    monkeypatch.setattr(triton_split_k, "FOLD", False)
    before = sum(k.count for k in SUM_KERNELS)
    reduced = run()
    assert sum(k.count for k in SUM_KERNELS) == before + 1
    monkeypatch.setattr(triton_split_k, "FOLD", True)
    folded = run(), run()
    assert sum(k.count for k in SUM_KERNELS) == before + 1  # no second launch when folded
    return (reduced, *folded)


@pytest.mark.parametrize("m,bias", [(3, True), (17, False)])
def test_gemv_split_k_folded_equals_the_reduce_kernel(monkeypatch, fold, m, bias):
    torch.manual_seed(m)
    x = torch.randn(m, 96)
    w = torch.randn(40, 96)
    b = torch.randn(40) if bias else None
    config = (16, 16, 32, 3, 4) if m <= 16 else (64, 16, 32, 2, 4)
    reduced, first, second = both_ways(monkeypatch, lambda: triton_gemv.split_k_matmul(x, w, b, config))
    assert first.equal(reduced) and second.equal(reduced)
    torch.testing.assert_close(reduced.float(), torch.nn.functional.linear(x.float(), w.float(),
                                                                             b.float() if bias else None),
                               rtol=2e-2, atol=2e-2)
    assert int(fold().count_nonzero()) == 0  # every tile's counter back at zero
    assert int(fold().numel()) == triton_split_k.MAX_FOLD_TILES


@pytest.mark.parametrize("m,config", [(1, (1, 16, 32, 3, 4)), (5, (16, 16, 32, 2, 4))])
def test_fp8_split_k_folded_equals_the_reduce_kernel(monkeypatch, fold, m, config):
    torch.manual_seed(m)
    x = torch.randn(m, 96)
    q, scale = fp8.quantize_rows(torch.randn(40, 96))
    b = torch.randn(40)
    reduced, first, second = both_ways(monkeypatch, lambda: triton_fp8_fast.split_k(x, q, scale, b, config))
    assert first.equal(reduced) and second.equal(reduced)
    assert int(fold().count_nonzero()) == 0


def test_fp8_split_k_on_e4m3_rows_folded_equals_the_reduce_kernel(monkeypatch, fold):
    torch.manual_seed(2)
    x = torch.randn(20, 128)
    q, scale = fp8.quantize_rows(torch.randn(48, 128))
    xq, xs = triton_fp8_fast.quantize_rows(x)
    reduced, first, second = both_ways(monkeypatch, lambda: triton_fp8_fast.split_k(
        xq, q, scale, None, (64, 16, 32, 2, 4), x_scale=xs.view(-1), out_dtype=torch.float32))
    assert first.equal(reduced) and second.equal(reduced)
    assert int(fold().count_nonzero()) == 0


def test_block_scaled_fp8_split_k_folded_equals_the_reduce_kernel(monkeypatch, fold):
    torch.manual_seed(3)
    x = torch.randn(4, 256)
    q = torch.randn(64, 256).to(torch.float8_e4m3fn)
    scale_inv = torch.rand(2, 2) + 0.5  # blocks of 32 x 128
    reduced, first, second = both_ways(monkeypatch, lambda: triton_fp8_fast.split_k(
        x, q, scale_inv, None, (16, 16, 64, 2, 4), block=(32, 128)))
    assert first.equal(reduced) and second.equal(reduced)
    assert int(fold().count_nonzero()) == 0


def test_launches_past_the_counters_take_the_reduce_kernel(monkeypatch, fold):
    monkeypatch.setattr(triton_split_k, "MAX_FOLD_TILES", 2)
    assert triton_split_k.fold_counters(torch.device("cpu"), 3) is None
    assert triton_split_k.fold_counters(torch.device("cpu"), 2) is not None
    monkeypatch.setattr(triton_split_k, "FOLD", False)
    assert triton_split_k.fold_counters(torch.device("cpu"), 1) is None


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_repacked_gguf_products_folded_equal_the_sum_kernel(monkeypatch, fold, qtype):
    from onebit.kernels import triton_gguf_repacked as tr
    from onebit.kernels.gguf_repack import RepackedMatrix
    from tests.test_gguf_kernels import random_blocks

    w = RepackedMatrix.from_blocks(torch.from_numpy(random_blocks(qtype, 40, 1024, 5, d_scale=0.01)), qtype, 1024)
    for m, config in [(1, tr.RepackedConfig("fma", 16, 1, split=2)), (3, tr.RepackedConfig("dot", 32, 1, split=4)),
                      (24, tr.RepackedConfig("int", 32, 1, split=2))]:
        x = torch.randn(m, 1024, generator=torch.Generator().manual_seed(m))
        assert tr.plan(w, m, config)[3] == 1  # split over K, partials summed in order
        reduced, first, second = both_ways(monkeypatch, lambda: tr.matmul_few_rows(x, w, config=config))
        assert first.equal(reduced) and second.equal(reduced), (m, config)
        assert int(fold().count_nonzero()) == 0
