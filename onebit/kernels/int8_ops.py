"""Byte-level integer instructions for Triton kernels: PRMT (pick four of eight bytes) and DP4A (four
8-bit products summed into a 32-bit integer), one instruction each on NVIDIA GPUs.

Triton has no operator for either, so on the GPU (`ASM` true) they are inline PTX; Triton's
interpreter runs no PTX, so with `ASM` false they are spelled out in shifts, masks and multiplies,
with the same results for every input (the CPU tests run that spelling; tests/test_int8_ops.py
holds both to a torch reference, and the sm_90 compile test checks the PTX carries the instructions).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _byte(a, b, index: tl.constexpr):
    """Byte `index` (0-7) of the eight bytes b:a (a's bytes 0-3, b's 4-7), as int32 0..255."""
    if index < 4:
        return (a >> (8 * index)) & 255
    return (b >> (8 * (index - 4))) & 255


@triton.jit
def byte_perm(a, b, SELECTOR: tl.constexpr, ASM: tl.constexpr):
    """int32 whose byte i is byte (SELECTOR >> 4i) & 7 of b:a (PTX `prmt.b32`, default mode; the
    selector's nibbles must be 0-7)."""
    if ASM:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, a * 0 + SELECTOR],
                                         dtype=tl.int32, is_pure=True, pack=1)
    out = _byte(a, b, SELECTOR & 7)
    out |= _byte(a, b, (SELECTOR >> 4) & 7) << 8
    out |= _byte(a, b, (SELECTOR >> 8) & 7) << 16
    return out | (_byte(a, b, (SELECTOR >> 12) & 7) << 24)


@triton.jit
def transpose_bytes(r0, r1, r2, r3, ASM: tl.constexpr):
    """The 4 x 4 byte matrix held by int32 rows r0..r3 (byte k of row i: element (i, k)) transposed:
    four int32 whose byte i is byte k of r_i, for k = 0..3. Eight PRMTs."""
    t0 = byte_perm(r0, r1, 0x5140, ASM)  # r0.0 r1.0 r0.1 r1.1
    t1 = byte_perm(r0, r1, 0x7362, ASM)  # r0.2 r1.2 r0.3 r1.3
    t2 = byte_perm(r2, r3, 0x5140, ASM)
    t3 = byte_perm(r2, r3, 0x7362, ASM)
    return (byte_perm(t0, t2, 0x5410, ASM), byte_perm(t0, t2, 0x7632, ASM),
            byte_perm(t1, t3, 0x5410, ASM), byte_perm(t1, t3, 0x7632, ASM))


@triton.jit
def _signed_byte(b, index: tl.constexpr):
    """Byte `index` (0-3) of int32 b, sign-extended."""
    return (b << (24 - 8 * index)) >> 24


@triton.jit
def dot4(a, b, c, A_SIGNED: tl.constexpr, ASM: tl.constexpr):
    """c + the sum over the four bytes i of a_i * b_i (int32): b's bytes signed, a's signed when
    A_SIGNED else unsigned (PTX `dp4a.s32.s32` / `dp4a.u32.s32`)."""
    if ASM:
        if A_SIGNED:
            return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                             dtype=tl.int32, is_pure=True, pack=1)
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    if A_SIGNED:
        return (c + _signed_byte(a, 0) * _signed_byte(b, 0) + _signed_byte(a, 1) * _signed_byte(b, 1)
                + _signed_byte(a, 2) * _signed_byte(b, 2) + _signed_byte(a, 3) * _signed_byte(b, 3))
    return (c + (a & 255) * _signed_byte(b, 0) + ((a >> 8) & 255) * _signed_byte(b, 1)
            + ((a >> 16) & 255) * _signed_byte(b, 2) + ((a >> 24) & 255) * _signed_byte(b, 3))
