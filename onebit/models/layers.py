"""Building blocks of the decoder: RMSNorm and the SwiGLU MLP."""

from __future__ import annotations

import torch
from torch import nn

from onebit.kernels import gemv, ops


class Linear(nn.Linear):
    """nn.Linear whose products of 1 to 16 rows may take a Triton kernel where one measured faster."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x @ weight.T + bias."""
        return gemv.linear(x, self.weight, self.bias)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of this [gate | up] product in one kernel where that applies
        (`gemv.linear_silu_mul`), else None."""
        return gemv.linear_silu_mul(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like the reference implementation."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Normalise the last dimension of x; with a residual, normalise x + residual and
        return (normed, x + residual), the sum being the next residual."""
        out, summed = ops.add_rms_norm(x, residual, self.weight, self.eps)
        return out if residual is None else (out, summed)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up in one matrix."""

    def __init__(self, hidden: int, intermediate: int, bias: bool):
        super().__init__()
        self.gate_up_proj = Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the MLP to x [T, hidden]."""
        return self.down_proj(self.activated(x))

    def activated(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate(x)) * up(x): by gate_up's product itself where it offers that (a `silu_mul` method that
        answers, e.g. `Linear`'s and `Fp8Linear`'s at one row), else the product and the SiLU kernel."""
        fused = getattr(self.gate_up_proj, "silu_mul", None)
        out = fused(x) if fused is not None else None
        return out if out is not None else ops.silu_mul(self.gate_up_proj(x))
