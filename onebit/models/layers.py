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
        """Apply the MLP to x [T, hidden]; where gate_up's product can apply SiLU * mul itself
        (`gemv.linear_silu_mul`: one row on the gemv kernel), it does."""
        gate_up = self.gate_up_proj
        activated = gemv.linear_silu_mul(x, gate_up.weight, gate_up.bias) if type(gate_up) is Linear else None
        if activated is None:
            activated = ops.silu_mul(gate_up(x))
        return self.down_proj(activated)
