"""Quantizing a loaded model's linear layers in place (`--quantize fp8`).

Every decoder `Linear` (attention projections and MLP) becomes an `Fp8Linear`: its weight is
quantized per output channel to e4m3 on the device, one layer at a time, and the bf16 copy is
freed, so the peak is the unquantized model plus one layer. The embedding and the output head
stay in the run dtype (the head's error would reach every logit; vLLM leaves it unquantized too).
"""

from __future__ import annotations

import torch
from torch import nn

from onebit.kernels import fp8
from onebit.models.layers import Linear

METHODS = ("fp8",)


class Fp8Linear(nn.Module):
    """A linear layer whose weight is e4m3 with one float32 scale per output channel."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("weight_scale", scale)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.out_features, self.in_features = qweight.shape

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> "Fp8Linear":
        """Quantize `layer`'s weight (on its device)."""
        q, scale = fp8.quantize_rows(layer.weight.detach())
        bias = layer.bias.detach() if layer.bias is not None else None
        return cls(q, scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x @ (qweight * scale).T + bias."""
        return fp8.linear(x, self.qweight, self.weight_scale, self.bias)


def fp8_layers(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Every `Fp8Linear` of `model` by name: (qweight, weight_scale, bias), for `fp8.calibrate`."""
    return {name: (m.qweight, m.weight_scale, m.bias) for name, m in model.named_modules() if isinstance(m, Fp8Linear)}


def quantize_model(model: nn.Module, method: str) -> int:
    """Replace every decoder `Linear` of `model` by its quantized form; returns how many."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization {method!r}; choose one of {', '.join(METHODS)}")
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, Linear) and name.rpartition(".")[2] != "lm_head"]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Fp8Linear.from_linear(module))
        del module
    return len(targets)
