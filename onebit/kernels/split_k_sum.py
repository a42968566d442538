"""A split-K product's result before its sum, for a reader that sums as it loads.

A split-K product (`triton_split_k`) writes one float32 partial per slice of K and then launches a
second kernel to sum them. At one activation row that sum is a launch of its own for a few KB
(about 1.4 us, 144 of them a step on an 8B model: 0.20 ms of a 2.8 ms FP8 step, G23 session 19).
A product whose only reader is one of the fused per-token kernels (add + RMSNorm, SiLU * mul) can
hand that reader the partials instead: it sums them in the same order with the same arithmetic
as the second launch would, so the numbers are bit for bit those of the two-launch path.

`SplitKSum.result()` is that second launch (or its torch reference off CUDA) for any reader that
does not sum as it loads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class SplitKSum(NamedTuple):
    """The unsummed result of a split-K product: y [M, N] = (sum over s of partial[s] in order)
    * scale (when given) + bias (when given), rounded to `dtype`."""

    partial: torch.Tensor  # [SPLIT, M, N] float32, contiguous
    scale: torch.Tensor | None  # [N] float32 column scale (per-channel FP8 weights)
    bias: torch.Tensor | None  # [N]
    dtype: torch.dtype  # the product's output dtype

    @property
    def shape(self) -> torch.Size:
        """The result's shape, [M, N]."""
        return self.partial.shape[1:]

    @property
    def device(self) -> torch.device:
        """Where the partials (and the result) live."""
        return self.partial.device

    def result(self) -> torch.Tensor:
        """The summed product [M, N] in `dtype`: the reduce kernel on CUDA, the reference elsewhere
        (both add the slices in order in float32, so they agree bit for bit)."""
        if self.partial.is_cuda:
            from onebit.kernels import triton_split_k

            y = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            triton_split_k.reduce_partials(self.partial, self.scale, self.bias, y)
            return y
        return sum_ref(self)


def sum_ref(pending: SplitKSum) -> torch.Tensor:
    """`SplitKSum.result` in torch ops: the slices added in order in float32, then scale and bias."""
    acc = pending.partial[0].clone()
    for part in pending.partial[1:]:
        acc += part
    if pending.scale is not None:
        acc = acc * pending.scale
    if pending.bias is not None:
        acc = acc + pending.bias.float()
    return acc.to(pending.dtype)


def resolve(x: torch.Tensor | SplitKSum) -> torch.Tensor:
    """x itself, or the summed result of a `SplitKSum`."""
    return x.result() if isinstance(x, SplitKSum) else x


def cuda_rows(x: torch.Tensor | SplitKSum) -> bool:
    """Whether a fused Triton reader can take x as it is: rows [T, D] on CUDA, a contiguous 2-D
    tensor or a `SplitKSum`."""
    if isinstance(x, SplitKSum):
        return x.partial.is_cuda
    return x.is_cuda and x.dim() == 2 and x.is_contiguous()
