"""The packed products past 64 rows in tiles (`triton_gguf_tiles`): against their float64 references
(Triton's interpreter on CPU, the GPU where there is one), equal to the 64-row kernel on one tile,
the routing of `triton_gguf_repacked.matmul` by TILES_MAX_ROWS, prepared rows, and the input it
refuses."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels.gguf_repack import F16Rows, repacked_f16_linear_ref, repacked_f16s_q6_k_linear_ref
from tests.test_gguf_f16 import DEVICE, _rel, _weight

tr = pytest.importorskip("onebit.kernels.triton_gguf_repacked")
tf = pytest.importorskip("onebit.kernels.triton_gguf_f16")
tt = pytest.importorskip("onebit.kernels.triton_gguf_tiles")


def _x(rows: int, seed: int) -> torch.Tensor:
    """Random rows with one far past float16's range (1e6) and one all zeros, in the second tile."""
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(seed))
    x[70] *= 1e6
    x[71] = 0.0
    return x


# (rows, block_m, config): a partial second tile, several 16-row tiles with the split-K sum, one
# program along K over three tiles
CASES = [(80, 64, tt.TILE_CONFIG), (100, 16, tr.RepackedConfig("f16s", 32, 1, split=2)),
         (130, 64, tr.RepackedConfig("f16s", 64, 1, split=1))]


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
def test_tiles_match_the_reference_past_64_rows(qtype):
    """Every row of every tile, the 1e6 row (scaled by 2**-6) and the zero row included, within f16s's
    float16 weight rounding of the float64 reference; mode "f16" (exact weights) within float32 sums."""
    w = _weight(qtype, 40, 512, seed=len(qtype) + 1)
    reference = repacked_f16s_q6_k_linear_ref if qtype == "Q6_K" else repacked_f16_linear_ref
    configs = [c for _, _, c in CASES] + ([tr.RepackedConfig("f16", 32, 1, split=2)] if qtype != "Q6_K" else [])
    for (m, block_m, _), config in zip(CASES + [CASES[1]], configs):
        x = _x(m, seed=m)
        want = reference(x.double(), w.to("cpu"))
        got = tt.matmul_tiles(x.to(DEVICE), w, config=config, block_m=block_m).float()
        assert got.shape == (m, 40) and torch.isfinite(got).all(), (m, config)
        bound = 1e-5 if config.mode == "f16" or (qtype == "Q6_K" and DEVICE == "cpu") else 4e-3
        assert _rel(got, want) < bound, (m, block_m, config, _rel(got, want))
        assert _rel(got[64:], want[64:]) < bound and _rel(got[70:71], want[70:71]) < bound, (m, block_m, config)
        assert got[71].abs().max().item() == 0.0  # the zero row


def test_a_tile_computes_what_the_64_row_kernel_computes():
    """One 64-row tile is the few-row launch of the same config (mode "f16s", 64-row tile, the same
    split), so the first 64 rows of a longer product equal the 64-row product bit for bit."""
    w = _weight("Q4_K", 40, 512, seed=3)
    x = _x(90, seed=4).to(DEVICE)
    config = tr.RepackedConfig("f16s", 32, 1, split=2)
    tiles = tt.matmul_tiles(x, w, config=config, block_m=64)
    few = tr.matmul_few_rows(x[:64].contiguous(), w, config=config)
    assert torch.equal(tiles[:64], few)


def test_matmul_routes_by_tiles_max_rows_and_type(monkeypatch):
    """Past 64 rows `matmul` takes the tiles up to TILES_MAX_ROWS rows for Q4_K / Q5_K / Q6_K (and then a
    producer should hand them `F16Rows`), the dequantized weight and the torch product above it and for
    Q8_0; both paths give the same numbers up to f16s's rounding."""
    calls = []
    tiles = tt.matmul_tiles

    def counted(x, weight, out=None, config=tt.TILE_CONFIG, block_m=tt.TILE_BLOCK_M):
        calls.append(x.shape[0])
        return tiles(x, weight, out, config, block_m)

    monkeypatch.setattr(tt, "matmul_tiles", counted)
    w, q8 = _weight("Q6_K", 40, 512, seed=7), _weight("Q8_0", 40, 512, seed=8)
    x = _x(80, seed=5).to(DEVICE, torch.float32)
    monkeypatch.setattr(tt, "TILES_MAX_ROWS", 0)
    plain = tr.matmul(x, w)
    assert calls == [] and not tr.reads_f16_rows(w, 80)
    monkeypatch.setattr(tt, "TILES_MAX_ROWS", 96)
    tiled = tr.matmul(x, w)
    assert calls == [80] and tr.reads_f16_rows(w, 80) and not tr.reads_f16_rows(w, 97)
    assert _rel(tiled, plain) < 4e-3
    tr.matmul(torch.cat([x, x[:17]]), w)  # 97 rows: above the limit
    tr.matmul(x, q8)
    assert calls == [80] and not tr.reads_f16_rows(q8, 80)


def test_tiles_take_prepared_rows():
    """`F16Rows` (a producer's `prepare_x` of x) give what x itself gives."""
    w = _weight("Q4_K", 40, 512, seed=9)
    x = _x(80, seed=6).to(DEVICE)
    assert torch.equal(tt.matmul_tiles(F16Rows(x, *tf.prepare_x(x)), w), tt.matmul_tiles(x, w))


def test_tiles_refuse_what_they_cannot_run():
    x = torch.zeros(80, 512, device=DEVICE)
    with pytest.raises(ValueError, match='not mode "f16s" on Q8_0'):
        tt.matmul_tiles(x, _weight("Q8_0", 16, 512, seed=1))
    with pytest.raises(ValueError, match='not mode "f16" on Q6_K'):
        tt.matmul_tiles(x, _weight("Q6_K", 16, 512, seed=1), config=tr.RepackedConfig("f16", 32, 1))
    with pytest.raises(ValueError, match='not mode "int"'):
        tt.matmul_tiles(x, _weight("Q4_K", 16, 512, seed=1), config=tr.RepackedConfig("int", 32, 1))
    with pytest.raises(ValueError, match="power of two of at least 16"):
        tt.matmul_tiles(x, _weight("Q4_K", 16, 512, seed=1), block_m=48)
    with pytest.raises(ValueError, match="x has 256 columns, the weight 512"):
        tt.matmul_tiles(torch.zeros(80, 256, device=DEVICE), _weight("Q4_K", 16, 512, seed=1))


def test_tile_split_fills_the_programs_and_divides_the_groups():
    w = _weight("Q4_K", 4096, 4096, seed=2) if DEVICE == "cuda" else None
    if w is None:  # the shapes only: a RepackedMatrix of the 8B o_proj's size without its bytes
        from onebit.kernels.gguf_repack import RepackedMatrix

        w = RepackedMatrix("Q4_K", 4096, 4096, *(torch.empty(0),) * 4)
    # 32 weight-row tiles x 2 row tiles = 64 programs; 256 wanted: split 4 (of 16 groups)
    assert tt.tile_split(w, 128, tt.TILE_CONFIG, 64) == 4
    assert tt.tile_split(w, 2048, tt.TILE_CONFIG, 64) == 1  # 32 x 32 tiles already
    assert tt.tile_split(w, 128, tr.RepackedConfig("f16s", 128, 1, split=2), 64) == 2
    assert tt.tile_split(w, 128, tr.RepackedConfig("f16s", 128, 1, programs=100_000), 64) == 16  # all 16 groups
