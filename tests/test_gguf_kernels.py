"""Packed GGUF weights: the torch dequantizer against `gguf.quants` (bit for bit), the torch encoders
against the `gguf` library and the tests' numpy encoder, and the Triton kernels against the torch
reference (Triton's interpreter on CPU, the GPU where there is one)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from onebit.kernels import gguf_quants as gq
from onebit.testing import gguf_encode
from tests.gguf_kquants import quantize_k

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
Q = gguf.GGMLQuantizationType


def random_blocks(qtype: str, rows: int, cols: int, seed: int, d_scale: float = 1.0) -> np.ndarray:
    """Raw rows of random bytes, whose f16 super-scales are finite random numbers."""
    layout = gq.LAYOUTS[qtype]
    rng = np.random.default_rng(seed)
    nb = cols // layout.values
    raw = rng.integers(0, 256, size=(rows, nb, layout.nbytes), dtype=np.uint8)
    d = (rng.standard_normal((rows, nb, layout.d_count)) * d_scale).astype(np.float16)
    raw[..., layout.d[0]:layout.d[1]] = d.view(np.uint8).reshape(rows, nb, -1)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("qtype", gq.PACKED_TYPES)
def test_dequantize_equals_the_gguf_library_bit_for_bit(qtype):
    raw = random_blocks(qtype, 7, 2 * gq.LAYOUTS[qtype].step, seed=len(qtype))
    want = gguf.quants.dequantize(raw, Q[qtype])
    got = gq.dequantize_blocks(torch.from_numpy(raw), qtype).numpy()
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("qtype", gq.PACKED_TYPES)
def test_packed_matrix_regroups_the_same_bytes(qtype):
    raw = torch.from_numpy(random_blocks(qtype, 5, 512, seed=3))
    packed = gq.PackedMatrix.from_blocks(raw, qtype, 512)
    assert packed.nbytes == raw.numel()  # nothing added, nothing lost
    assert torch.equal(packed.blocks(), raw)
    assert torch.equal(packed.dequantize(), gq.dequantize_blocks(raw, qtype))


def test_can_pack_needs_whole_steps():
    assert gq.can_pack("Q4_K", 512) and gq.can_pack("Q8_0", 384) and gq.can_pack("Q6_K", 1024)
    assert not gq.can_pack("Q4_K", 384) and not gq.can_pack("Q8_0", 96) and not gq.can_pack("Q4_0", 512)
    with pytest.raises(ValueError, match="multiple of 256"):
        gq.PackedMatrix.empty("Q4_K", 4, 384)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K"])
def test_torch_encoders_write_the_reference_bytes(qtype):
    g = torch.Generator().manual_seed(11)
    w = torch.randn(12, 512, generator=g) * torch.rand(12, 1, generator=g)
    w[0, :64] = 0  # all-zero blocks and sub-blocks
    got = gguf_encode.ENCODERS[qtype](w).numpy()
    want = gguf.quants.quantize(w.numpy(), Q.Q8_0) if qtype == "Q8_0" else quantize_k(w.numpy(), Q[qtype])
    assert np.array_equal(got, want)
    back = gq.dequantize_blocks(torch.from_numpy(got), qtype)
    rel = ((back - w).norm() / w.norm()).item()
    assert rel < {"Q8_0": 0.01, "Q6_K": 0.03, "Q4_K": 0.12}[qtype], rel


triton_gguf = pytest.importorskip("onebit.kernels.triton_gguf")


def _weight(qtype: str, rows: int, cols: int, seed: int) -> gq.PackedMatrix:
    raw = torch.from_numpy(random_blocks(qtype, rows, cols, seed, d_scale=0.01))
    return gq.PackedMatrix.from_blocks(raw.to(DEVICE), qtype, cols)


@pytest.mark.parametrize("qtype", gq.PACKED_TYPES)
@pytest.mark.parametrize("m,n,k", [(1, 64, 512), (3, 40, 256), (16, 64, 512), (20, 48, 512)])
def test_triton_matmul_matches_the_reference(qtype, m, n, k):
    w = _weight(qtype, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    want = x.float() @ w.dequantize().t()
    configs = [None, triton_gguf.CONFIGS[0]] if m <= 16 else [None]
    for config in configs:
        got = triton_gguf.matmul(x, w, config=config)
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err < (1e-5 if DEVICE == "cpu" else 2e-3), (config, err)


def test_triton_matmul_writes_into_a_column_slice():
    w = _weight("Q4_K", 32, 256, seed=1)
    x = torch.randn(2, 256).to(DEVICE)
    out = torch.full((2, 96), 7.0, device=DEVICE)
    triton_gguf.matmul(x, w, out[:, 32:64])
    assert (out[:, :32] == 7).all() and (out[:, 64:] == 7).all()
    want = x @ w.dequantize().t()
    assert ((out[:, 32:64] - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.parametrize("qtype", gq.PACKED_TYPES)
def test_triton_dequantize_equals_the_reference(qtype):
    w = _weight(qtype, 24, 512, seed=5)
    got = triton_gguf.dequantize(w, torch.float32)
    assert torch.equal(got.cpu(), w.dequantize().cpu())


def test_many_rows_go_through_the_dequantized_weight():
    w = _weight("Q6_K", 32, 256, seed=2)
    x = torch.randn(triton_gguf.MAX_KERNEL_ROWS + 3, 256).to(DEVICE)
    got = triton_gguf.matmul(x, w)
    want = x @ w.dequantize().t()
    assert ((got - want).norm() / want.norm()).item() < 2e-3


def test_packed_linear_stacks_parts_of_different_types_and_adds_the_bias():
    parts = [_weight("Q4_K", 16, 256, seed=1), _weight("Q6_K", 16, 256, seed=2), _weight("Q8_0", 8, 256, seed=3)]
    x = torch.randn(4, 256).to(DEVICE)
    bias = torch.randn(40).to(DEVICE)
    want = x @ torch.cat([p.dequantize() for p in parts]).t() + bias
    for rows in (x, x[:1]):  # each part's kernel writes its columns of one output
        got = gq.packed_linear(rows, parts, bias, kernels=True)
        assert ((got - want[:len(rows)]).norm() / want[:len(rows)].norm()).item() < 2e-3
    assert torch.equal(gq.packed_linear_ref(x.cpu(), [_p_cpu(p) for p in parts], bias.cpu()),
                       torch.nn.functional.linear(x.cpu(), torch.cat([p.dequantize().cpu() for p in parts]),
                                                  bias.cpu()))


def _p_cpu(p: gq.PackedMatrix) -> gq.PackedMatrix:
    return gq.PackedMatrix(p.qtype, p.rows, p.cols, p.quants.cpu(), p.scales.cpu(), p.d.cpu())


FEW_ROWS_VARIANTS = [
    triton_gguf.FewRowsConfig("gemv", 8, 2, 0, "sum", 4, 3),
    triton_gguf.FewRowsConfig("gemv", 4, 1, 1, "sum", 2, 2),  # one program along K: stores directly
    triton_gguf.FewRowsConfig("gemv", 8, 1, 2, "atomic", 4, 3),
    triton_gguf.FewRowsConfig("dot", 16, 1, 0, "sum", 4, 3),
    triton_gguf.FewRowsConfig("dot", 16, 2, 1, "sum", 4, 3),
    triton_gguf.FewRowsConfig("dot", 32, 1, 2, "atomic", 4, 3),
]


def _few_rows_close(qtype, m, n, k, configs):
    w = _weight(qtype, n, k, seed=m + n + 1)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + 7)).to(DEVICE)
    want = gq.packed_linear_ref(x.float(), [w])
    for config in configs:
        got = triton_gguf.matmul_few_rows(x, w, config=config)
        err = ((got.float() - want).norm() / want.norm()).item()
        assert err < (1e-5 if DEVICE == "cpu" else 2e-3), (config, err)


@pytest.mark.parametrize("qtype", gq.PACKED_TYPES)
@pytest.mark.parametrize("m,n,k", [(1, 40, 512), (3, 24, 256), (16, 16, 1024)])
def test_few_rows_kernel_matches_the_reference(qtype, m, n, k):
    # k = 256: one super-block (Q6_K's d's then read as halves, not words; no split); n not a multiple
    # of the tile; the CUDA-core variant (gemv) up to 8 rows, as the device sweep runs it
    _few_rows_close(qtype, m, n, k, [c for c in FEW_ROWS_VARIANTS if c.kernel == "dot" or m <= 8])


@pytest.mark.parametrize("qtype", gq.PACKED_TYPES)
def test_every_swept_few_rows_config_matches_the_reference(qtype):
    _few_rows_close(qtype, 4, 24, 512, triton_gguf.FEW_ROWS_CONFIGS.values())


def test_few_rows_kernel_writes_a_column_slice_and_is_picked_by_matmul(monkeypatch):
    w = _weight("Q4_K", 32, 512, seed=4)
    x = torch.randn(2, 512).to(DEVICE)
    want = x @ w.dequantize().t()
    for config in (triton_gguf.FewRowsConfig("gemv", 8, 1, 2, "sum"), triton_gguf.FewRowsConfig("dot", 16, 1, 2,
                                                                                                  "atomic")):
        out = torch.full((2, 96), 7.0, device=DEVICE)
        triton_gguf.matmul(x, w, out[:, 32:64], config=config)
        assert (out[:, :32] == 7).all() and (out[:, 64:] == 7).all()
        assert ((out[:, 32:64] - want).norm() / want.norm()).item() < 2e-3
    calls = []
    monkeypatch.setattr(triton_gguf, "matmul_few_rows", lambda *a: calls.append(a[3]) or a[2])
    monkeypatch.setattr(triton_gguf, "FEW_ROWS_DEFAULT", lambda rows: triton_gguf.FewRowsConfig(block_n=rows))
    triton_gguf.matmul(x, w)
    assert calls == [triton_gguf.FewRowsConfig(block_n=2)]
    monkeypatch.setattr(triton_gguf, "FEW_ROWS_DEFAULT", None)  # the default: the tile kernel
    assert ((triton_gguf.matmul(x, w) - want).norm() / want.norm()).item() < 2e-3 and len(calls) == 1


def test_few_rows_split_and_sb_shrink_to_divide_the_steps():
    w = _weight("Q4_K", 8, 768, seed=6)  # 3 super-blocks: SB 2 and split 2 both fall back to 1
    x = torch.randn(1, 768).to(DEVICE)
    got = triton_gguf.matmul_few_rows(x, w, config=triton_gguf.FewRowsConfig(sb=2, split=2))
    want = x @ w.dequantize().t()
    assert ((got - want).norm() / want.norm()).item() < 1e-5
