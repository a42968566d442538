"""Row-wise argmax of a step's logits [rows, vocab], spread over the whole GPU.

Greedy decoding takes the argmax of every logits row each step. torch's reduction ran it at 8 us for one
row of a 151,936-token vocabulary and 22 us for 64 rows (H200, session 33's step profile: 0.9 TB/s of
bf16 logits), because it gives each row few programs. Here a first pass splits each row into chunks, enough
programs for two waves over the SMs whatever the row count, each keeping its chunk's maximum and the
first index holding it; a second pass, one program a row, picks the largest of those, the earliest chunk
among equals. The result is torch.argmax's: the first index of the maximum, 0 for a row of -inf. A NaN
ranks as +inf here (torch ranks it above +inf; logits hold neither unless the model is broken).
One compiled variant a dtype: the chunk length is a runtime argument. Reference: `torch.argmax`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from onebit.kernels.triton_decode import sm_count

BLOCK = 1024  # values a program loads at once (4 warps, 8 a thread)
MAX_SPLITS = 128  # chunks a row at most: the second pass reads them in one block
_LAST = tl.constexpr(2**31 - 1)  # an index above every real one


@triton.jit
def _argmax_chunks_kernel(x_ptr, value_ptr, index_ptr, n_cols, stride_x, chunk, BLOCK: tl.constexpr,
                          MAX_SPLITS: tl.constexpr):
    row, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    start = split * chunk
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_index = start + lanes  # a lane's first column: its answer if it never sees more than -inf
    for offset in range(0, chunk, BLOCK):  # chunk is a multiple of BLOCK
        cols = start + offset + lanes
        v = tl.load(x_ptr + row * stride_x + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        v = tl.where(v != v, float("inf"), v)
        better = v > best  # strict: a lane keeps its earlier column on a tie
        best = tl.where(better, v, best)
        best_index = tl.where(better, cols, best_index)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_index, _LAST), axis=0)
    tl.store(value_ptr + row * MAX_SPLITS + split, top)
    tl.store(index_ptr + row * MAX_SPLITS + split, first)


@triton.jit(do_not_specialize=["splits"])  # one variant whatever the count (1 and multiples of 16 would differ)
def _argmax_merge_kernel(value_ptr, index_ptr, out_ptr, splits, MAX_SPLITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, MAX_SPLITS)
    ok = lanes < splits
    values = tl.load(value_ptr + row * MAX_SPLITS + lanes, mask=ok, other=float("-inf"))
    indices = tl.load(index_ptr + row * MAX_SPLITS + lanes, mask=ok, other=_LAST)
    top = tl.max(values, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(values == top, indices, _LAST), axis=0).to(tl.int64))


def chunk_length(rows: int, n_cols: int, sms: int) -> int:
    """Columns a first-pass program covers: a multiple of BLOCK, short enough that rows x chunks fill two
    waves of `sms` SMs, long enough that a row has at most MAX_SPLITS chunks."""
    wanted_splits = max(1, -(-2 * sms // rows))
    chunk = max(BLOCK, n_cols // wanted_splits // BLOCK * BLOCK)  # rounded down: at least the splits wanted
    fewest = -(-n_cols // MAX_SPLITS)
    return max(chunk, -(-fewest // BLOCK) * BLOCK)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for x [rows, vocab] with unit column stride: int64 [rows]."""
    rows, n_cols = x.shape
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    chunk = chunk_length(rows, n_cols, sm_count(x.device))
    splits = -(-n_cols // chunk)
    values = torch.empty((rows, MAX_SPLITS), dtype=torch.float32, device=x.device)
    indices = torch.empty((rows, MAX_SPLITS), dtype=torch.int32, device=x.device)
    _argmax_chunks_kernel[(rows, splits)](x, values, indices, n_cols, x.stride(0), chunk, BLOCK=BLOCK,
                                          MAX_SPLITS=MAX_SPLITS, num_warps=4)
    _argmax_merge_kernel[(rows,)](values, indices, out, splits, MAX_SPLITS=MAX_SPLITS, num_warps=4)
    return out
