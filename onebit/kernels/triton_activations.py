"""The SwiGLU activation as every Triton kernel here computes it, so that a kernel that fuses it gives
the bits of the one that does not.

`silu_times(gate, up)`: silu(gate) * up with gate and up in the product's dtype, each step rounded to
that dtype (SiLU first, then the multiply), as `triton_fused.silu_mul` does after a gate_up product.
Reference: `fused_ref.silu_mul_ref` (within a rounding of it).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_times(gate, up):
    """silu(gate) * up, each step rounded to gate's dtype."""
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
