"""Mode "g16" of the packed GGUF products (`gluon_gguf_g16`: Q4_K at 8-64 rows in Gluon, each plane's wgmma
left in flight while the next plane is dequantized): its float64 reference against the exact product
(CPU), the kernel against that reference on the GPU (Gluon runs in no interpreter; the sm_90 compile
is checked on the CPU in tests/test_triton_sm90_compile.py), and the inputs it refuses."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels.gguf_repack import (F16Rows, RepackedMatrix, repacked_f16s_q6_k_linear_ref, repacked_g16_linear_ref,
                                       repacked_linear_ref)
from tests.test_gguf_kernels import random_blocks

tr = pytest.importorskip("onebit.kernels.triton_gguf_repacked")
g16 = pytest.importorskip("onebit.kernels.gluon_gguf_g16")

ON_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0) and g16.available()
NEEDS_GPU = "Gluon's wgmma needs a Hopper GPU; the CPU compiles it (test_triton_sm90_compile)"


def _weight(rows: int, cols: int, seed: int, device: str = "cpu", qtype: str = "Q4_K") -> RepackedMatrix:
    raw = torch.from_numpy(random_blocks(qtype, rows, cols, seed, d_scale=0.01))
    return RepackedMatrix.from_blocks(raw, qtype, cols).to(device)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want.double().cpu()).norm() / want.double().cpu().norm()).item()


def _x(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random rows, one far past float16's range (1e6: prepared with a scale of 2**-6) and one zero."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    x[min(1, rows - 1)] *= 1e6
    if rows > 2:
        x[2] = 0.0
    return x


def test_reference_rounds_each_weight_once_to_float16_with_the_minimum_folded_in():
    """float16(code * float16(d * scale) - float16(dmin * min)): off the exact product by the weights'
    and x's rounding to float16 (2**-11 relative each), not more; and not equal to it (it does round)."""
    w = _weight(24, 512, seed=5)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(9)).double()
    exact = repacked_linear_ref(x, w)
    ref = repacked_g16_linear_ref(x, w)
    assert 0 < _rel(ref, exact) < 2e-3
    big = _x(4, 512, seed=3).double()  # the 1e6 row on its own: the prepared scale keeps it in range
    assert _rel(repacked_g16_linear_ref(big, w)[1:2], repacked_linear_ref(big, w)[1:2]) < 2e-3
    with pytest.raises(ValueError, match='takes Q4_K and Q6_K, not Q8_0'):
        repacked_g16_linear_ref(x, _weight(16, 512, seed=1, qtype="Q8_0"))


def test_q6_k_reference_is_f16s_rounding():
    """Q6_K's weights round as mode "f16s" rounds them: float16(float16(d * scale) * (code - 32))."""
    w = _weight(24, 512, seed=6, qtype="Q6_K")
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2)).double()
    ref = repacked_g16_linear_ref(x, w)
    assert torch.equal(ref, repacked_f16s_q6_k_linear_ref(x, w))
    assert 0 < _rel(ref, repacked_linear_ref(x, w)) < 2e-3


def test_g16_is_refused_off_cuda_and_for_other_types_and_reductions():
    x = torch.randn(8, 512)
    if not ON_GPU:
        with pytest.raises(ValueError, match='mode "g16" runs on a CUDA device'):
            tr.matmul_few_rows(x, _weight(16, 512, seed=1), config=tr.CONFIGS["g16-n64-p512"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with pytest.raises(ValueError, match='mode "g16" takes Q4_K, Q6_K, not Q8_0'):
        tr.matmul_few_rows(x.to(device), _weight(16, 512, seed=1, device=device, qtype="Q8_0"),
                           config=tr.CONFIGS["g16-n64-p512"])
    with pytest.raises(ValueError, match="split-K sums"):
        tr.matmul_few_rows(x.to(device), _weight(16, 512, seed=1, device=device),
                           config=tr.RepackedConfig("g16", 64, 1, reduce="atomic"))
    # the sweep asks `takes` first
    plain = tr.CONFIGS["g16-n64-p256"]
    assert tr.takes(plain, "Q4_K") and tr.takes(plain, "Q6_K") and not tr.takes(plain, "Q8_0") and not tr.takes(tr.CONFIGS["h2-n128-t1-s0"], "Q8_0")


def test_a_g16_pick_runs_as_f16s_where_g16_cannot():
    """The table's g16 picks (measured on the H200) hold on Hopper; elsewhere (here: weights on the CPU)
    `config_for` hands out G16_ELSEWHERE, a mode every Triton GPU runs."""
    rows = [m for (qtype, m, *shape), config in tr.DEFAULT.items()
            if qtype == "Q4_K" and not shape and config.mode == "g16"]
    assert rows, "the shipped table picks g16 for Q4_K (session 23's sweep)"
    w = _weight(200, 1024, seed=1)
    for m in rows:
        assert tr.DEFAULT["Q4_K", m].mode == "g16" and tr.config_for(w, m) == tr.G16_ELSEWHERE
    assert tr.G16_ELSEWHERE.mode == "f16s" and not tr.runs_g16(torch.device("cpu"))
    if ON_GPU:
        assert tr.config_for(w.to("cuda"), rows[0]) == tr.DEFAULT["Q4_K", rows[0]]


def test_a_triton_whose_gluon_fails_to_compile_the_kernel_is_a_warning_not_a_failed_start(monkeypatch, caplog):
    """`compiles` (asked by `runs_g16` once a process) compiles the kernel ahead of time (that this
    Triton compiles it: test_triton_sm90_compile, in a child process; on the GPU the pick test above); a
    compiler that raises makes it False with a warning naming the Triton and the error."""
    if not g16.available():
        pytest.skip("this Triton has no Gluon: compiles() is False before any compile")

    def broken(*args, **kwargs):
        raise AttributeError("module has no attribute 'thread_barrier'")

    monkeypatch.setattr(g16, "compile_sm90", broken)
    g16.compiles.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=g16.__name__):
            assert g16.compiles() is False
        assert "does not compile with Triton" in caplog.text and "thread_barrier" in caplog.text
    finally:
        g16.compiles.cache_clear()


# (rows, config): a row tile of 8 and of 64, past the weight's end (N = 200), split-K sums and one
# program along K (at split 4 a program walks one turn: the next turn's copy masked off), with and
# without the code-word prefetch; every config the sweep times.
CASES = [(1, tr.RepackedConfig("g16", 64, 1, split=2)), (8, tr.RepackedConfig("g16", 64, 1, split=4, stages=1)),
         (13, tr.RepackedConfig("g16", 128, 1, split=1, stages=1)),
         (tr.MAX_INT_ROWS, tr.RepackedConfig("g16", 64, 1, split=1)),
         (tr.MAX_INT_ROWS, tr.RepackedConfig("g16", 128, 1, split=2, stages=1))]
CASES += [(m, config) for name, config in tr.CONFIGS.items() if config.mode == "g16" for m in (8, 64)]


@pytest.mark.skipif(not ON_GPU, reason=NEEDS_GPU)
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("m,config", CASES)
def test_g16_matches_its_reference_on_the_gpu(m, config, qtype):
    w = _weight(200, 1024, seed=m, device="cuda", qtype=qtype)
    if not tr.takes(config, qtype):
        with pytest.raises(ValueError, match="3 or more for Q4_K"):
            tr.matmul_few_rows(torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16), w, config=config)
        return
    x = _x(m, 1024, seed=m)
    got = tr.matmul_few_rows(x.to("cuda", torch.bfloat16), w, config=config).float()
    xb = x.to(torch.bfloat16).double()
    want = repacked_g16_linear_ref(xb, w.to("cpu"))
    assert torch.isfinite(got).all()
    assert _rel(got, want) < 4e-3, _rel(got, want)  # the bf16 output's rounding and float32 sums
    assert _rel(got, repacked_linear_ref(xb, w.to("cpu"))) < 5e-3
    # rows prepared by their producer give the same numbers as a prepare_x launch
    from onebit.kernels import triton_gguf_f16

    xc = x.to("cuda", torch.bfloat16)
    assert torch.equal(tr.matmul_few_rows(F16Rows(xc, *triton_gguf_f16.prepare_x(xc)), w, config=config),
                       tr.matmul_few_rows(xc, w, config=config))
