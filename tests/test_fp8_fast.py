"""The second generation of FP8 kernels (`triton_fp8_fast`: the split-K weight-only product and
the one-pass per-token quantizer) against their plain-torch references, in Triton's interpreter
on CPU (the GPU where there is one), and the per-row-count dispatch of `fp8.linear`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from onebit.kernels import fp8
from tests.test_fp8 import _case as fp8_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton_fast = pytest.importorskip("onebit.kernels.triton_fp8_fast")


def _case(m, n, k, bias, seed, dtype=torch.float32):
    """(x, q, scale, bias) of test_fp8's random product, on DEVICE."""
    return fp8_case(m, n, k, bias, seed, dtype)[:4]


# (rows, N, K, bias, (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT, warps)): one row and row tiles; N not a
# multiple of BLOCK_N; K shorter than a tile, a multiple of the slices, and slices running past K
# (the last ones partial or empty); the fp32 partials and their reduction (SPLIT > 1) with a bias.
CASES = [(1, 37, 300, False, (1, 16, 512, 1, 4)), (1, 64, 1024, True, (1, 16, 256, 4, 4)),
         (1, 40, 1000, True, (1, 32, 256, 8, 4)), (3, 33, 512, True, (16, 16, 512, 1, 4)),
         (5, 48, 768, False, (16, 32, 256, 4, 4)), (16, 70, 640, True, (16, 64, 256, 2, 8)),
         (40, 96, 256, True, (32, 32, 256, 4, 4)), (70, 50, 384, False, (64, 32, 128, 2, 4))]


@pytest.mark.parametrize("m,n,k,bias,config", CASES)
def test_split_k_matches_the_weight_only_reference(m, n, k, bias, config):
    x, q, scale, b = _case(m, n, k, bias, seed=m * n + k)
    want = fp8.weight_only_ref(x, q, scale, b)
    got = triton_fast.split_k(x, q, scale, b, config)
    assert got.shape == want.shape and got.dtype == x.dtype
    err = ((got - want).norm() / want.norm()).item()
    assert err < (1e-5 if DEVICE == "cpu" else 2e-3), err


def test_every_listed_config_runs_on_a_small_product():
    # On the GPU in the models' dtype: float32 rows in 512-long K tiles need more shared memory than
    # the H200 has (calibration leaves out a config that cannot compile; these are the ones it times).
    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    for m in (1, 4, 20):
        x, q, scale, b = _case(m, 24, 384, True, seed=m, dtype=dtype)
        want = fp8.weight_only_ref(x, q, scale, b)
        for config in triton_fast.candidates(m):
            got = triton_fast.split_k(x, q, scale, b, config)
            assert ((got - want).norm() / want.norm()).item() < (1e-5 if DEVICE == "cpu" else 2e-3), (m, config)


# e4m3 rows (w8a8): fewer rows than the tile, and more; N not a multiple of BLOCK_N; K past the
# last whole tile; fp32 partials (SPLIT > 1) with a bias; a 128-row tile; a deeper pipeline (sixth element).
W8A8_CASES = [(16, 70, 640, True, (64, 64, 256, 2, 4)), (5, 48, 768, False, (64, 32, 256, 4, 4)),
              (70, 96, 512, True, (64, 64, 256, 1, 4)), (130, 50, 384, False, (128, 64, 128, 2, 8)),
              (64, 80, 300, True, (64, 64, 128, 4, 4)), (40, 130, 1024, True, (64, 128, 128, 2, 4, 5))]


def test_every_w8a8_candidate_runs_on_a_small_product():
    x, q, scale, b = _case(64, 40, 512, True, seed=7)  # 40 columns: a partial 32- and 64-column tile
    want = fp8.w8a8_ref(x, q, scale, b)
    xq, xs = triton_fast.quantize_rows(x)
    for config in triton_fast.w8a8_candidates(64):
        got = triton_fast.split_k(xq, q, scale, b, config, x_scale=xs.view(-1), out_dtype=x.dtype)
        assert ((got - want).norm() / want.norm()).item() < (1e-5 if DEVICE == "cpu" else 2e-3), config


@pytest.mark.parametrize("m,n,k,bias,config", W8A8_CASES)
def test_split_k_on_e4m3_rows_matches_the_w8a8_reference(m, n, k, bias, config):
    x, q, scale, b = _case(m, n, k, bias, seed=m + n * k)
    want = fp8.w8a8_ref(x, q, scale, b)
    xq, xs = triton_fast.quantize_rows(x)
    got = triton_fast.split_k(xq, q, scale, b, config, x_scale=xs.view(-1), out_dtype=x.dtype)
    assert got.shape == want.shape and got.dtype == x.dtype
    err = ((got - want).norm() / want.norm()).item()
    assert err < (1e-5 if DEVICE == "cpu" else 2e-3), err
    # the run_kernel kind does the same, quantizing on its own, and is judged against the same reference
    assert fp8.run_kernel("split_k_w8a8", config, x, q, scale, b).equal(got)
    # and it is not the weight-only product (e4m3 rows round the activations)
    assert ((got - fp8.weight_only_ref(x, q, scale, b)).norm() / want.norm()).item() > 1e-4


def test_w8a8_candidates_start_at_16_rows_and_refuse_what_they_cannot_take():
    assert triton_fast.w8a8_candidates(8) == [] and triton_fast.w8a8_candidates(triton_fast.MAX_ROWS + 1) == []
    assert all(c[0] >= 64 for m in (16, 64, 256) for c in triton_fast.w8a8_candidates(m))
    assert all(c[0] == 64 for c in triton_fast.w8a8_candidates(64))  # no 128-row tile for 64 rows
    # the deeper pipelines are timed from DEEP_FROM_ROWS rows on
    assert all(len(c) == 5 for c in triton_fast.w8a8_candidates(triton_fast.DEEP_FROM_ROWS - 1))
    assert {len(c) for c in triton_fast.w8a8_candidates(triton_fast.DEEP_FROM_ROWS)} == {5, 6}
    kinds = {kind for kind, _ in fp8.candidates(64, 4096, 4096)}
    assert {"split_k", "scaled_mm", "split_k_w8a8"} <= kinds
    assert "split_k_w8a8" not in {kind for kind, _ in fp8.candidates(8, 4096, 4096)}
    x, q, scale, _ = _case(16, 32, 256, False, seed=1)
    xq, xs = triton_fast.quantize_rows(x)
    with pytest.raises(ValueError, match="tensor-core tiles"):
        triton_fast.split_k(xq, q, scale, None, (1, 16, 256, 1, 4), x_scale=xs.view(-1), out_dtype=x.dtype)
    with pytest.raises(ValueError, match="tensor-core tiles"):
        triton_fast.split_k(xq, q, scale, None, (64, 16, 256, 1, 4), x_scale=xs.view(-1))


def test_split_k_refuses_more_than_max_rows():
    x, q, scale, _ = _case(triton_fast.MAX_ROWS + 1, 16, 64, False, seed=2)
    with pytest.raises(ValueError, match="at most"):
        triton_fast.split_k(x, q, scale, None, triton_fast.MANY_ROW_CONFIGS[0])


def test_fused_quantizer_equals_the_reference_bit_for_bit():
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()  # every e4m3 value, both zeros' sign aside
    ties = (grid[1:] + grid[:-1]) / 2  # halfway between neighbours: rounding to even decides
    g = torch.Generator().manual_seed(4)
    rows = [torch.cat([grid, ties, torch.tensor([-0.0, 1e-9, -1e-9])]),  # amax 448: scale exactly 1
            torch.randn(5000, generator=g) * 30,  # longer than one 4096-wide tile: two passes per row
            torch.randn(5000, generator=g) * 1e-3, torch.zeros(5000)]
    k = max(len(r) for r in rows)
    x = torch.stack([torch.nn.functional.pad(r, (0, k - len(r))) for r in rows]).to(DEVICE)
    got_q, got_scale = triton_fast.quantize_rows(x)
    want_q, want_scale = fp8.quantize_rows(x)
    assert got_scale.shape == (4, 1) and torch.equal(got_scale[:, 0], want_scale)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))


def test_fused_quantizer_reads_bf16_rows_with_a_stride():
    x = (torch.randn(6, 200, generator=torch.Generator().manual_seed(5)) * 7).to(torch.bfloat16).to(DEVICE)
    view = x[:, :130]  # row stride 200, 130 columns
    got_q, got_scale = triton_fast.quantize_rows(view)
    want_q, want_scale = fp8.quantize_rows(view)
    assert torch.equal(got_scale[:, 0], want_scale) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))


def test_block_quantizer_equals_the_reference_bit_for_bit():
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()
    ties = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(6)
    outlier = torch.randn(1100, generator=g)
    outlier[700] = 5e3  # one large value: only its block's scale grows
    rows = [torch.cat([grid, ties, torch.tensor([-0.0, 1e-9, -1e-9])]), outlier, torch.zeros(1100)]
    k = 1100  # two whole blocks of 512 and a partial one
    x = torch.stack([torch.nn.functional.pad(r, (0, k - len(r))) for r in rows]).to(DEVICE)
    got_q, got_scale = triton_fast.quantize_row_blocks(x, 512)
    want_q, want_scale = fp8.quantize_row_blocks(x, 512)
    assert got_scale.shape == want_scale.shape == (3, 3)
    assert torch.equal(got_scale, want_scale) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    # the outlier's row: only block 1's scale grows; every block comes back within e4m3's rounding
    assert (want_scale[1, [0, 2]] * 1000 < want_scale[1, 1]).all()
    back = fp8.dequantize_row_blocks(want_q, want_scale, 512)
    assert ((back - x).abs() <= x.abs() / 16 + want_scale.repeat_interleave(512, 1)[:, :k] / 2**9).all()
    view = (torch.randn(4, 1200, generator=g) * 3).to(torch.bfloat16).to(DEVICE)[:, :700]  # bf16, row stride 1200
    got_q, got_scale = triton_fast.quantize_row_blocks(view, 256)
    want_q, want_scale = fp8.quantize_row_blocks(view, 256)
    assert torch.equal(got_scale, want_scale) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))


# e4m3 rows with one scale per row and block of fp8.ACTIVATION_BLOCK values: K a whole number of blocks,
# K past the last whole block and tile (a partial block), splits, a bias, a 128-row tile, a deep pipeline.
BLOCK_W8A8_CASES = [(64, 70, 1024, True, (64, 64, 256, 1, 4, 4)), (20, 40, 1300, False, (64, 32, 256, 4, 4)),
                    (64, 48, 1536, True, (64, 64, 512, 2, 4)), (130, 33, 640, True, (128, 64, 128, 1, 8))]


@pytest.mark.parametrize("m,n,k,bias,config", BLOCK_W8A8_CASES)
def test_split_k_on_row_block_scales_matches_its_reference(m, n, k, bias, config):
    x, q, scale, b = _case(m, n, k, bias, seed=m + n + k)
    x[:, 3] *= 300  # an outlier column: it sets every row's scale, but only its block's
    want = fp8.w8a8_blocks_ref(x, q, scale, b)
    got = fp8.run_kernel(fp8.BLOCK_W8A8_KIND, config, x, q, scale, b)
    assert got.shape == want.shape and got.dtype == x.dtype
    assert ((got - want).norm() / want.norm()).item() < (1e-5 if DEVICE == "cpu" else 2e-3)
    # and it is not the per-row product (the outlier column coarsens every per-row scale)
    assert ((got - fp8.w8a8_ref(x, q, scale, b)).norm() / want.norm()).item() > 1e-4


def test_split_k_refuses_row_block_scales_that_do_not_fit(monkeypatch):
    x, q, scale, _ = _case(16, 32, 1024, False, seed=3)
    xq, xs = triton_fast.quantize_row_blocks(x, 256)
    with pytest.raises(ValueError, match="do not fit"):  # a K tile longer than the block
        triton_fast.split_k(xq, q, scale, None, (64, 32, 512, 1, 4), x_scale=xs, out_dtype=x.dtype, x_block=256)
    with pytest.raises(ValueError, match="do not fit"):  # scales of another block size
        triton_fast.split_k(xq, q, scale, None, (64, 32, 128, 1, 4), x_scale=xs, out_dtype=x.dtype, x_block=512)
    assert fp8.BLOCK_FORM  # on since session 26 measured it
    kinds = [kind for kind, config in fp8.candidates(64, 4096, 4096)]
    assert kinds.count(fp8.BLOCK_W8A8_KIND) == kinds.count("split_k_w8a8") > 0
    assert fp8.BLOCK_W8A8_KIND not in {kind for kind, _ in fp8.candidates(8, 4096, 4096)}
    monkeypatch.setattr(fp8, "BLOCK_FORM", False)  # the switch an A/B turns off
    assert fp8.BLOCK_W8A8_KIND not in {kind for kind, _ in fp8.candidates(64, 4096, 4096)}


@pytest.fixture
def clean_choices():
    fp8.reset()
    yield
    fp8.reset()


def test_a_product_takes_the_choice_of_the_fewest_calibrated_rows_at_or_above_it(clean_choices):
    a, b, c = ("split_k", (1, 16, 512, 4, 4)), ("split_k", (16, 32, 256, 4, 4)), ("scaled_mm", None)
    fp8._CHOSEN[(96, 256, False)] = [(1, a), (8, b), (64, c)]
    assert [fp8.choice_for(m, 96, 256, False) for m in (1, 2, 8, 9, 64)] == [a, b, b, c, c]
    assert fp8.choice_for(65, 96, 256, False) == fp8.default_choice(65, 96, 256)  # above every calibrated count
    assert fp8.choice_for(1, 96, 256, True) == fp8.default_choice(1, 96, 256)  # another shape (with a bias)


def test_uncalibrated_rule_takes_split_k_then_the_first_kernel_then_scaled_mm():
    assert fp8.default_choice(1, 4096, 4096) == ("split_k", triton_fast.default_config(1))
    assert fp8.default_choice(16, 4096, 4096)[0] == "split_k"
    assert fp8.default_choice(17, 4096, 4096)[0] == "weight_only"
    assert fp8.default_choice(65, 4096, 4096) == ("scaled_mm", None)
    assert fp8.default_choice(65, 40, 4096)[0] == "split_k"  # N not a multiple of 16: no _scaled_mm
    assert fp8.default_choice(triton_fast.MAX_ROWS + 1, 40, 4096) == ("ref", None)


def test_default_configs_are_candidates_that_fit_their_rows():
    for m in (1, 2, 16, 17, 64, 256):
        config = triton_fast.default_config(m)
        assert config in triton_fast.candidates(m)
        assert (config[0] == 1) == (m == 1)


def test_calibration_chooses_nothing_for_weights_off_cuda(clean_choices):
    _, q, scale, _ = _case(1, 32, 64, False, seed=6)
    if DEVICE == "cuda":
        q, scale = q.cpu(), scale.cpu()
    assert fp8.calibrate({"w": (q, scale, None)}, [1, 8]) == [] and not fp8._CHOSEN


def test_fp8_layers_lists_each_quantized_linear():
    from onebit.models.layers import Linear
    from onebit.models.quantize import Fp8Linear, fp8_layers, quantize_model

    model = nn.Sequential(Linear(64, 32), nn.Sequential(Linear(32, 48, bias=False)))
    assert quantize_model(model, "fp8") == 2
    layers = fp8_layers(model)
    assert sorted(layers) == ["0", "1.0"]
    for name, (q, scale, bias) in layers.items():
        module = model.get_submodule(name)
        assert isinstance(module, Fp8Linear) and q is module.qweight and scale is module.weight_scale
        assert (bias is None) == (name == "1.0")


@pytest.mark.skipif(DEVICE != "cuda", reason="calibration times the kernels in CUDA graphs")
def test_calibrated_linear_matches_its_reference_on_the_gpu(clean_choices):
    x, q, scale, b = _case(1, 256, 512, True, seed=8, dtype=torch.bfloat16)
    lines = fp8.calibrate({"w": (q, scale, b)}, [1, 8, 64, 128])
    assert len(lines) == 4 and [m for m, _ in fp8._CHOSEN[(256, 512, True)]] == [1, 8, 64, 128]
    for m in (1, 5, 8, 64, 100, 128):
        x, _, _, _ = _case(m, 256, 512, True, seed=m, dtype=torch.bfloat16)
        kind, _ = fp8.choice_for(m, 256, 512, True)
        want = (fp8.w8a8_ref if kind.startswith("scaled_mm") else fp8.weight_only_ref)(x.float(), q, scale, b)
        got = fp8.linear(x, q, scale, b).float()
        assert ((got - want).norm() / want.norm()).item() < 1e-2, (m, kind)


@pytest.mark.skipif(DEVICE != "cuda", reason="calibration times the kernels in CUDA graphs")
def test_a_product_fed_block_scaled_rows_calibrates_and_runs_them_on_the_gpu(clean_choices, monkeypatch):
    monkeypatch.setattr(fp8, "BLOCK_FORM", True)
    _, q, scale, b = _case(1, 256, 1024, True, seed=10, dtype=torch.bfloat16)
    fp8.calibrate({"down": (q, scale, b)}, [16, 64], fed={"down": "blocks"})
    assert [m for m, _ in fp8._CHOSEN_QUANTIZED_INPUT[(256, 1024, True, "blocks")]] == [16, 64]
    assert "e4m3 blocks 256x1024" in fp8.picks()
    for m in (16, 40, 64):
        x, _, _, _ = _case(m, 256, 1024, True, seed=m, dtype=torch.bfloat16)
        rows = fp8.Fp8Rows(*triton_fast.quantize_row_blocks(x, fp8.ACTIVATION_BLOCK), x.dtype, fp8.ACTIVATION_BLOCK)
        got = fp8.linear(rows, q, scale, b, "blocks").float()
        kind, _ = fp8.choice_for(m, 256, 1024, True, "blocks")
        assert fp8.takes_quantized_rows(m, 256, 1024, True, x.device, "blocks") == (kind == fp8.BLOCK_W8A8_KIND)
        if kind == fp8.BLOCK_W8A8_KIND:  # the block form on the rows as they came; rounding the bf16
            # output alone is 1.7e-3 of this float32 reference, a wrong block scale >= 1e-2
            want, tolerance = fp8.w8a8_blocks_ref(x.float(), q, scale, b), 5e-3
        else:  # never asked for by a producer; the rows' values through the chosen kind
            want, tolerance = fp8.weight_only_ref(x.float(), q, scale, b), 5e-2
        assert ((got - want).norm() / want.norm()).item() < tolerance, (m, kind)


# Block-scaled weights (published FP8 checkpoints), (rows, N, K, block, bias, config): one row with
# a K tile of four block columns (summed per block, then scaled) and of exactly one; N not a
# multiple of the block rows; K past the last whole tile; tensor-core row tiles one block column
# deep; SPLIT > 1 whose partials come scaled (the reduce applies no column scale).
BLOCK_CASES = [(1, 96, 512, (128, 128), True, (1, 16, 512, 4, 4)), (1, 96, 512, (128, 128), False, (1, 32, 128, 2, 4)),
               (1, 100, 384, (64, 128), True, (1, 16, 256, 1, 4)), (3, 96, 512, (128, 128), True, (16, 32, 128, 2, 4)),
               (5, 70, 320, (32, 64), False, (16, 16, 64, 3, 4))]


@pytest.mark.parametrize("m,n,k,block,bias,config", BLOCK_CASES)
def test_split_k_with_block_scales_matches_the_block_reference(m, n, k, block, bias, config):
    gen = torch.Generator().manual_seed(m * n + k)
    x = torch.randn(m, k, generator=gen).to(DEVICE)
    q = (torch.randn(n, k, generator=gen) * 40).clamp(-448, 448).to(fp8.FP8).to(DEVICE)
    scale_inv = (torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) + 0.5).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DEVICE) if bias else None
    want = fp8.block_weight_only_ref(x, q, scale_inv, block, b)
    got = triton_fast.split_k(x, q, scale_inv, b, config, block=block)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < (1e-5 if DEVICE == "cpu" else 2e-3), err


def test_block_candidates_fit_their_block_and_keep_the_first_kernel():
    for rows in (1, 4, 16, 64):
        for block in ((128, 128), (64, 64)):
            found = fp8.block_candidates(rows, block)
            assert found[0] == ("weight_only", None)
            assert len(found) > 1  # split-K configs too
            for kind, (bm, _, tile_k, _, _) in found[1:]:
                assert kind == "split_k" and (block[1] % tile_k == 0 or (bm == 1 and tile_k % block[1] == 0))


def test_a_block_product_takes_its_calibrated_kernel_else_the_first(clean_choices):
    a = ("split_k", (1, 16, 512, 4, 4))
    fp8._CHOSEN_BLOCKS[(96, 512, (128, 128), False)] = [(1, a), (16, ("weight_only", None))]
    assert fp8.block_choice_for(1, 96, 512, (128, 128), False) == a
    assert fp8.block_choice_for(8, 96, 512, (128, 128), False) == ("weight_only", None)
    assert fp8.block_choice_for(1, 96, 512, (64, 64), False) == ("weight_only", None)  # another block: uncalibrated


def test_picks_report_each_table_by_shape_and_rows(monkeypatch):
    monkeypatch.setattr(fp8, "_CHOSEN", {(4096, 1024, False): [(1, ("split_k", (1, 16, 512, 4, 4))),
                                                               (64, ("scaled_mm", None))]})
    monkeypatch.setattr(fp8, "_CHOSEN_QUANTIZED_INPUT", {
        (6144, 1024, True, "rows"): [(64, ("split_k_w8a8", (64, 64, 256, 1, 4, 4)))],
        (1024, 3072, False, "blocks"): [(64, (fp8.BLOCK_W8A8_KIND, (64, 64, 256, 1, 4, 4)))]})
    assert fp8.picks() == {"4096x1024": {1: "split_k (1, 16, 512, 4, 4)", 64: "scaled_mm None"},
                           "e4m3 rows 6144x1024": {64: "split_k_w8a8 (64, 64, 256, 1, 4, 4)"},
                           "e4m3 blocks 1024x3072": {64: "split_k_w8a8_blocks (64, 64, 256, 1, 4, 4)"}}


# (N, K, config, block): K a whole number of tiles and not (the first tile masked), SPLIT 1 and more
# (each slice's first tile early, an empty last slice), per-column scales and a block-scaled weight.
EARLY_CASES = [(40, 4096, (1, 4, 2048, 1, 4), None), (24, 700, (1, 8, 512, 1, 4), None),
               (40, 1000, (1, 16, 256, 3, 4), None), (96, 512, (1, 16, 512, 4, 4), (128, 128)),
               (100, 384, (1, 16, 256, 1, 4), (64, 128))]


@pytest.mark.parametrize("n,k,config,block", EARLY_CASES)
def test_the_early_first_weight_tile_gives_the_same_bits(n, k, config, block, monkeypatch):
    """`pdl.early_weights`: the one-row kernel that loads its slice's first weight tile before waiting
    for the previous kernel sums the same tiles in the same order as the one that waits first."""
    from onebit.kernels import pdl

    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(1, k, generator=gen).to(DEVICE)
    q = (torch.randn(n, k, generator=gen) * 40).clamp(-448, 448).to(fp8.FP8).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DEVICE)
    if block:
        scale = (torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) + 0.5).to(DEVICE)
    else:
        scale = (torch.rand(n, generator=gen) + 0.5).to(DEVICE)
    plain = triton_fast.split_k(x, q, scale, b, config, block=block)
    monkeypatch.setattr(pdl, "early_weights", lambda: True)
    early = triton_fast.split_k(x, q, scale, b, config, block=block)
    assert torch.equal(early, plain)
    want = fp8.block_weight_only_ref(x, q, scale, block, b) if block else fp8.weight_only_ref(x, q, scale, b)
    assert ((early.float() - want.float()).norm() / want.float().norm()).item() < (1e-5 if DEVICE == "cpu" else 2e-3)


@pytest.mark.parametrize("inter,k,config,bias,early", [(20, 4096, (1, 4, 2048, 1, 4), True, False),
                                                       (13, 700, (1, 8, 512, 1, 4), False, True),
                                                       (40, 1000, (1, 16, 256, 1, 4), True, True)])
def test_gate_up_with_silu_mul_fused_gives_the_bits_of_the_two_kernels(inter, k, config, bias, early, monkeypatch):
    """`split_k_silu_mul`: one launch summing gate rows and up rows over the same x, then SiLU * mul,
    equal bit for bit to `split_k` followed by `triton_fused.silu_mul` (a part column tile, K past the last
    whole tile, with and without the early first tile)."""
    from onebit.kernels import pdl, triton_fused

    dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    gen = torch.Generator().manual_seed(inter + k)
    x = torch.randn(1, k, generator=gen).to(dtype).to(DEVICE)
    q = (torch.randn(2 * inter, k, generator=gen) * 40).clamp(-448, 448).to(fp8.FP8).to(DEVICE)
    scale = (torch.rand(2 * inter, generator=gen) * 0.01 + 0.001).to(DEVICE)
    b = torch.randn(2 * inter, generator=gen).to(dtype).to(DEVICE) if bias else None
    want = triton_fused.silu_mul(triton_fast.split_k(x, q, scale, b, config))
    monkeypatch.setattr(pdl, "early_weights", lambda: early)
    got = triton_fast.split_k_silu_mul(x, q, scale, b, config)
    assert got.shape == (1, inter) and got.dtype == dtype and torch.equal(got, want)
    gate, up = fp8.weight_only_ref(x.float(), q, scale, b.float() if bias else None).float().cpu().chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up
    assert ((got.float().cpu() - ref).norm() / ref.norm()).item() < 2e-2


def test_gate_up_with_silu_mul_refuses_rows_splits_and_odd_weights():
    x, q = torch.zeros(2, 64, device=DEVICE), torch.zeros(8, 64, dtype=fp8.FP8, device=DEVICE)
    scale = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="one row"):
        triton_fast.split_k_silu_mul(x, q, scale, None, (1, 4, 64, 1, 4))
    with pytest.raises(ValueError, match="one row"):
        triton_fast.split_k_silu_mul(x[:1], q, scale, None, (1, 4, 32, 2, 4))
    with pytest.raises(ValueError, match="one row"):
        triton_fast.split_k_silu_mul(x[:1], q[:7], scale[:7], None, (1, 4, 64, 1, 4))


def test_silu_mul_config_is_the_one_row_pick_without_a_split_and_only_with_the_switch(clean_choices, monkeypatch):
    narrow, split = ("split_k", (1, 4, 2048, 1, 4)), ("split_k", (1, 16, 512, 4, 4))
    fp8._CHOSEN[(96, 256, False)] = [(1, narrow), (8, ("split_k", (16, 32, 256, 4, 4)))]
    fp8._CHOSEN[(64, 256, False)] = [(1, split)]
    assert fp8.SILU_IN_GATE_UP  # on by default since session 28
    monkeypatch.setattr(fp8, "SILU_IN_GATE_UP", False)
    assert fp8.silu_mul_config(1, 96, 256, False) is None
    monkeypatch.setattr(fp8, "SILU_IN_GATE_UP", True)
    assert fp8.silu_mul_config(1, 96, 256, False) == narrow[1]
    assert fp8.silu_mul_config(2, 96, 256, False) is None  # more rows
    assert fp8.silu_mul_config(1, 64, 256, False) is None  # a split: its partials are summed elsewhere
    assert fp8.silu_mul_config(1, 95, 256, False) is None  # no [gate | up] halves
    assert fp8.linear_silu_mul(torch.zeros(1, 256), torch.zeros(96, 256, dtype=fp8.FP8), torch.ones(96)) is None
