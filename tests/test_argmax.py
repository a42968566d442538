"""The two-pass argmax of a step's logits (`triton_argmax`) against torch.argmax: Triton's interpreter on
the CPU, the kernel itself on a GPU."""

from __future__ import annotations

import pytest
import torch

from onebit.kernels import ops, triton_argmax

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(x: torch.Tensor) -> list[int]:
    got = triton_argmax.argmax_rows(x.to(DEVICE)).cpu()
    assert got.dtype == torch.int64
    assert got.tolist() == x.float().argmax(dim=-1).tolist()
    return got.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_rows_take_torch_argmax(rows, dtype):
    gen = torch.Generator().manual_seed(rows)
    _check((torch.randn(rows, 5000, generator=gen) * 3).to(dtype))


def test_a_full_vocabulary_row_many_chunks_and_a_short_last_one():
    x = torch.randn(1, 151_936, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    splits = -(-151_936 // triton_argmax.chunk_length(1, 151_936, 132))
    assert splits > 8 and 151_936 % triton_argmax.chunk_length(1, 151_936, 132)  # a partial last chunk
    x[0, 151_935] = 40.0  # the maximum in the last chunk's last column
    assert _check(x) == [151_935]


def test_ties_go_to_the_first_index_within_and_across_chunks():
    n = 151_936
    chunk = triton_argmax.chunk_length(2, n, 132)
    assert chunk >= 2 * triton_argmax.BLOCK  # a chunk of two blocks or more: one lane sees both ties below
    x = torch.zeros(2, n)
    x[0, [7 + triton_argmax.BLOCK, 7, chunk + 1]] = 5.0  # one lane of two blocks, then a later chunk
    x[1, [2 * chunk + 1, chunk + 3, chunk + 2]] = 5.0  # across chunks, the earliest is in the second one
    assert _check(x) == [7, chunk + 2]


def test_rows_of_minus_infinity_and_nan():
    x = torch.full((3, 3000), float("-inf"))
    x[1, 2500] = 0.0
    x[2, 100], x[2, 40] = 1.0, float("nan")  # NaN ranks first, as in torch (no +inf in the row)
    assert _check(x) == [0, 2500, 40]


def test_no_rows_is_an_empty_answer():
    assert triton_argmax.argmax_rows(torch.zeros((0, 5000), device=DEVICE)).shape == (0,)


def test_chunks_fill_two_waves_and_stay_within_the_second_pass():
    def splits(rows: int) -> int:
        chunk = triton_argmax.chunk_length(rows, 151_936, 132)
        assert chunk % triton_argmax.BLOCK == 0
        return -(-151_936 // chunk)
    assert 64 <= splits(1) <= triton_argmax.MAX_SPLITS  # one row: as many chunks as the second pass takes
    assert 8 * splits(8) >= 264 and 64 * splits(64) >= 264  # two waves of 132 SMs
    assert splits(264) <= 2 and splits(512) <= 2  # enough rows: about one program a row


def test_ops_dispatch_keeps_torch_off_cuda():
    x = torch.randn(4, 100)
    if DEVICE == "cpu":
        assert ops.argmax_rows(x).tolist() == x.argmax(-1).tolist()
    else:
        assert ops.argmax_rows(x.cuda()).tolist() == x.argmax(-1).tolist()
