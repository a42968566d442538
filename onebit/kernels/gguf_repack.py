"""GGUF blocks repacked at load into a layout a GPU streams well, dequantizing to the same values.

The GGUF block layouts (`gguf_quants`) interleave fields of 1-2 bytes at byte-unaligned offsets
(Q4_K's eight 6-bit scales and mins share 12 bytes); decoding them in a kernel costs integer ops and
narrow scattered loads per weight. `RepackedMatrix` holds the same numbers regrouped:

- codes: int32 [rows, cols / 8] (Q8_0: cols / 4). Each row is cut into groups of GROUP values
  (Q4_K, Q5_K: 256, one super-block; Q6_K, Q8_0: 128) stored as 32 (Q6_K: 16) words; word p of a
  group holds plane j (bits BITS*j ..) = the code of value group * GROUP + j * LANES + p, where
  LANES is the words per group. So one plane of one group is LANES consecutive values with one
  scale: a kernel loads a row's groups as wide contiguous vectors and gets a sub-block per shift.
- high: the bits above the 4-bit planes: Q5_K uint8 [rows, cols / 8] (byte p of a group, bit j:
  the fifth bit of value 32j + p: GGUF's own qh bytes), Q6_K int16 [rows, cols / 8] (element p of
  a group, bits 2j, 2j+1: the top two bits of value 16j + p); empty for Q4_K and Q8_0.
- scales: Q4_K/Q5_K uint8 [rows, cols / 16] (per super-block its 8 six-bit scales, then its 8 mins,
  one byte each); Q6_K int8 [rows, cols / 16] (GGUF's scales, one per 16 values); empty for Q8_0.
- d: Q4_K/Q5_K float16 (d, dmin) per super-block and Q8_0 float16 d per 32 values, as in the file
  (a kernel reads them as 32-bit words: one per super-block, two per group); Q6_K float32 d per
  super-block (one f16 per super-block is not a whole word).

Value = scale * code - offset in float32, with (as `gguf_quants.dequantize_blocks` computes them):
Q4_K/Q5_K scale = d * sc, offset = dmin * m (sub-blocks of 32); Q6_K scale = d * sc and code - 32
(sub-blocks of 16); Q8_0 d * code (signed). Every product is exact in float32, so `dequantize`
equals the GGUF reference bit for bit.

Bytes per weight (GGUF's in brackets): Q4_K 0.578 (0.5625), Q5_K 0.703 (0.6875), Q6_K 0.828 (0.820),
Q8_0 1.0625 (the same): Q4_K/Q5_K spend 16 bytes instead of 12 per super-block on scales, Q6_K 4
instead of 2 on d.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from onebit.kernels import gguf_quants as gq

# qtype -> (values per group, words per group = LANES, bits per plane, planes per word)
GROUPING = {"Q4_K": (256, 32, 4, 8), "Q5_K": (256, 32, 4, 8), "Q6_K": (128, 16, 4, 8), "Q8_0": (128, 32, 8, 4)}
REPACKED_TYPES = tuple(GROUPING)


def bytes_per_weight(qtype: str) -> float:
    """Bytes the repacked layout holds per weight."""
    return {"Q4_K": 148 / 256, "Q5_K": 180 / 256, "Q6_K": 212 / 256, "Q8_0": 34 / 32}[qtype]


def _to_words(planes: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., P, L] small unsigned codes -> int32 [..., L]: plane j in bits bits*j (two's complement wrap)."""
    shifts = (torch.arange(planes.shape[-2], device=planes.device) * bits).reshape(-1, 1)
    words = (planes.to(torch.int64) << shifts).sum(dim=-2)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _from_words(words: torch.Tensor, bits: int, planes: int) -> torch.Tensor:
    """int32 [..., L] -> [..., P, L] unsigned codes (uint8)."""
    shifts = (torch.arange(planes, device=words.device) * bits).reshape(-1, 1)
    return ((words.to(torch.int64).unsqueeze(-2) >> shifts) & (2**bits - 1)).to(torch.uint8)


def _pack_scale_min_k4(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """[n, 8] six-bit scales and mins -> GGUF's 12 packed bytes [n, 12] (inverse of gq._scale_min_k4)."""
    d = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    m = (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6)
    md = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return torch.cat([d, m, md], dim=-1)


def _q6_k_codes(b: torch.Tensor) -> torch.Tensor:
    """Q6_K blocks [n, 210] -> unsigned codes [n, 256] (0..63; the value is d * sc * (code - 32))."""
    n = b.shape[0]
    low = b[:, 0:128].reshape(n, 2, 1, 64)
    low = torch.cat([low & 0x0F, low >> 4], dim=2).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 4, 1)
    high = ((b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    return (low | (high << 4)).reshape(n, 256)


def _q6_k_blocks(codes: torch.Tensor) -> torch.Tensor:
    """Unsigned codes [n, 256] -> ql [n, 128] and qh [n, 64] bytes as Q6_K stores them."""
    n = codes.shape[0]
    halves = codes.reshape(n, 2, 2, 64)  # value h*128 + nib*64 + byte
    ql = (halves[:, :, 0] & 0x0F) | ((halves[:, :, 1] & 0x0F) << 4)
    top = (codes >> 4).reshape(n, 2, 4, 32)  # value h*128 + s*32 + l
    qh = top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6)
    return torch.cat([ql.reshape(n, 128), qh.reshape(n, 64)], dim=-1)


@dataclass
class RepackedMatrix:
    """A [rows, cols] GGUF matrix of one type in the GPU layout of this module (see its docstring)."""

    qtype: str
    rows: int
    cols: int
    codes: torch.Tensor
    high: torch.Tensor
    scales: torch.Tensor
    d: torch.Tensor

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.high, self.scales, self.d))

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """The four arrays by name."""
        return {"codes": self.codes, "high": self.high, "scales": self.scales, "d": self.d}

    @classmethod
    def from_blocks(cls, raw: torch.Tensor, qtype: str, cols: int) -> "RepackedMatrix":
        """Repack raw GGUF rows (uint8 [rows, row bytes]) on raw's device."""
        if qtype not in GROUPING:
            raise ValueError(f"no repacked layout for {qtype}")
        if not gq.can_pack(qtype, cols):
            raise ValueError(f"a repacked {qtype} matrix needs a multiple of {gq.LAYOUTS[qtype].step} columns")
        rows = raw.shape[0]
        layout = gq.LAYOUTS[qtype]
        group, lanes, bits, planes = GROUPING[qtype]
        b = raw.reshape(-1, layout.nbytes)  # one block per row of b
        empty8 = torch.empty(rows, 0, dtype=torch.uint8, device=raw.device)
        if qtype == "Q8_0":
            q = b[:, 2:].reshape(rows, cols // group, planes, lanes)  # value 32j + p of a 128-group
            codes = _to_words(q, bits)
            return cls(qtype, rows, cols, codes.reshape(rows, -1), empty8, empty8,
                       b[:, 0:2].contiguous().view(torch.float16).reshape(rows, -1))
        if qtype == "Q6_K":
            q = _q6_k_codes(b).reshape(rows, cols // group, planes, lanes)  # value 16j + p of a 128-group
            codes = _to_words(q & 0x0F, bits)
            top = (q >> 4).to(torch.int64)
            high = (top << (2 * torch.arange(planes, device=raw.device).reshape(-1, 1))).sum(dim=-2)
            high = torch.where(high >= 2**15, high - 2**16, high).to(torch.int16)
            return cls(qtype, rows, cols, codes.reshape(rows, -1), high.reshape(rows, -1),
                       b[:, 192:208].reshape(rows, -1).contiguous(),
                       b[:, 208:210].contiguous().view(torch.float16).float().reshape(rows, -1))
        sc, mn = gq._scale_min_k4(b[:, 4:16])
        q = gq._nibbles(b[:, 48:176] if qtype == "Q5_K" else b[:, 16:144], b.shape[0])  # [n, 8 sub, 32]
        codes = _to_words(q, bits)
        high = b[:, 16:48].reshape(rows, -1).contiguous() if qtype == "Q5_K" else empty8
        return cls(qtype, rows, cols, codes.reshape(rows, -1), high,
                   torch.cat([sc, mn], dim=-1).reshape(rows, -1),
                   b[:, 0:4].contiguous().view(torch.float16).reshape(rows, -1))

    @classmethod
    def from_packed(cls, packed: gq.PackedMatrix) -> "RepackedMatrix":
        """Repack a `gguf_quants.PackedMatrix` (on its device)."""
        return cls.from_blocks(packed.blocks(), packed.qtype, packed.cols)

    def codes_unsigned(self) -> torch.Tensor:
        """Every weight's unsigned code in column order, uint8 [rows, cols] (Q5_K/Q6_K with their high
        bits; Q8_0's signed code + 128)."""
        group, lanes, bits, planes = GROUPING[self.qtype]
        q = _from_words(self.codes.reshape(self.rows, -1, lanes), bits, planes)  # [rows, groups, P, L]
        if self.qtype == "Q5_K":
            high = _from_words(self.high.reshape(self.rows, -1, lanes).to(torch.int32) & 0xFF, 1, planes)
            q = q | (high << 4)
        elif self.qtype == "Q6_K":
            high = _from_words(self.high.reshape(self.rows, -1, lanes).to(torch.int32) & 0xFFFF, 2, planes)
            q = q | (high << 4)
        elif self.qtype == "Q8_0":
            q = q ^ 0x80
        return q.reshape(self.rows, self.cols)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The [rows, cols] values in `dtype` (through float32, the same operations as the GGUF reference)."""
        q = self.codes_unsigned()
        if self.qtype == "Q8_0":
            signed = (q ^ 0x80).view(torch.int8).float().reshape(self.rows, -1, 32)
            values = signed * self.d.float().reshape(self.rows, -1, 1)
        elif self.qtype == "Q6_K":
            scale = (self.d.float().reshape(self.rows, -1, 1) * self.scales.view(torch.int8).float().reshape(
                self.rows, -1, 16)).reshape(self.rows, -1, 1)
            values = scale * (q.to(torch.int8) - 32).float().reshape(self.rows, -1, 16)
        else:
            sm = self.scales.reshape(self.rows, -1, 2, 8).float()
            dm = self.d.float().reshape(self.rows, -1, 2, 1)
            scale = (dm[:, :, 0] * sm[:, :, 0]).reshape(self.rows, -1, 1)
            offset = (dm[:, :, 1] * sm[:, :, 1]).reshape(self.rows, -1, 1)
            values = scale * q.float().reshape(self.rows, -1, 32) - offset
        return values.reshape(self.rows, self.cols).to(dtype)

    def blocks(self) -> torch.Tensor:
        """The GGUF block rows again (uint8 [rows, row bytes]): the inverse of `from_blocks`."""
        layout = gq.LAYOUTS[self.qtype]
        q = self.codes_unsigned()
        nb = self.cols // layout.values
        d_bytes = self.d.half().contiguous().view(torch.uint8).reshape(self.rows * nb, -1)
        if self.qtype == "Q8_0":
            body = (q ^ 0x80).reshape(self.rows * nb, 32)
            return torch.cat([d_bytes, body], dim=-1).reshape(self.rows, -1)
        if self.qtype == "Q6_K":
            body = _q6_k_blocks(q.reshape(self.rows * nb, 256))
            return torch.cat([body, self.scales.reshape(self.rows * nb, 16), d_bytes], dim=-1).reshape(self.rows, -1)
        sm = self.scales.reshape(self.rows * nb, 16)
        packed_scales = _pack_scale_min_k4(sm[:, :8], sm[:, 8:])
        sub = (q & 0x0F).reshape(self.rows * nb, 4, 2, 32)  # sub-block 2c: low nibbles of chunk c
        qs = (sub[:, :, 0] | (sub[:, :, 1] << 4)).reshape(self.rows * nb, 128)
        parts = [d_bytes, packed_scales]
        if self.qtype == "Q5_K":
            parts.append(self.high.reshape(self.rows * nb, 32))
        return torch.cat(parts + [qs], dim=-1).reshape(self.rows, -1)

    def to(self, device) -> "RepackedMatrix":
        """The same matrix on `device`."""
        return RepackedMatrix(self.qtype, self.rows, self.cols, *(t.to(device) for t in self.tensors.values()))


def repacked_linear_ref(x: torch.Tensor, weight: RepackedMatrix) -> torch.Tensor:
    """x [T, K] @ weight.T: the weight dequantized to x's dtype, then `F.linear` (what a model
    dequantized at load computes)."""
    return torch.nn.functional.linear(x, weight.dequantize(x.dtype))


def sub_block_scales(weight: RepackedMatrix) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(scale, offset, size): float32 [rows, cols / size] per sub-block of `size` values (Q4_K/Q5_K/Q8_0
    32, Q6_K 16), so that value = scale * code - offset with the code unsigned (Q8_0 and Q6_K: the
    signed code, code - 32; offset 0), each product formed as `dequantize` forms it."""
    if weight.qtype == "Q8_0":
        scale = weight.d.float()
        return scale, torch.zeros_like(scale), 32
    if weight.qtype == "Q6_K":
        scale = (weight.d.float().reshape(weight.rows, -1, 1)
                 * weight.scales.view(torch.int8).float().reshape(weight.rows, -1, 16)).reshape(weight.rows, -1)
        return scale, torch.zeros_like(scale), 16
    sm = weight.scales.reshape(weight.rows, -1, 2, 8).float()
    dm = weight.d.float().reshape(weight.rows, -1, 2, 1)
    return ((dm[:, :, 0] * sm[:, :, 0]).reshape(weight.rows, -1), (dm[:, :, 1] * sm[:, :, 1]).reshape(weight.rows, -1),
            32)


def sub_block_codes(weight: RepackedMatrix) -> torch.Tensor:
    """Every weight's code as `sub_block_scales` pairs it (value = scale * code - offset): int32
    [rows, cols], signed for Q8_0 and Q6_K (code - 32), unsigned for Q4_K and Q5_K."""
    q = weight.codes_unsigned().to(torch.int32)
    if weight.qtype == "Q8_0":
        return q - 128
    if weight.qtype == "Q6_K":
        return q - 32
    return q


def repacked_int_linear_ref(x: torch.Tensor, weight: RepackedMatrix) -> torch.Tensor:
    """x [T, K] @ weight.T as mode "int" of `triton_gguf_repacked` computes it, in float32: per sub-block
    (one scale s and offset o per weight row) D = x_sb @ codes_sb.T on the exact integer codes, then
    y = sum over sub-blocks of s * D - o * sum(x_sb). This reassociates the dequantize-then-multiply
    product (`repacked_linear_ref`): the weights are never rounded to x's dtype; the float32 sums carry
    the error instead (bounded in tests/test_gguf_repacked.py). The codes here are the true ones
    (signed for Q8_0 and Q6_K); the kernel adds 128 to the unsigned ones and takes 128 * s * sum(x_sb)
    off again, the same value up to float32 rounding."""
    scale, offset, size = sub_block_scales(weight)
    q = sub_block_codes(weight)
    xs = x.float().reshape(x.shape[0], -1, size)  # [T, S, size]
    dots = torch.einsum("tsk,nsk->tns", xs, q.float().reshape(weight.rows, -1, size))
    return (scale[None] * dots - offset[None] * xs.sum(dim=-1)[:, None, :]).sum(dim=-1).to(x.dtype)


# The types whose sub-block scale times code fits float16 exactly (6-bit scales, 4- or 5-bit codes): the
# ones mode "f16" of the packed products takes.
F16_TYPES = ("Q4_K", "Q5_K")


class F16Rows(NamedTuple):
    """Activation rows x [M, K] together with mode "f16"'s preparation of them, made by their producer
    (`triton_gguf_f16.add_rms_norm_f16`) instead of a `prepare_x` launch before each product: x16
    float16 [M, K], xm float16 [M, K / 32] and xe float32 [M] as `prepare_x` returns them. x itself
    stays for the modes and parts that read it."""

    x: torch.Tensor
    x16: torch.Tensor
    xm: torch.Tensor
    xe: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """The activations' shape, [T, K] (what the attention block reads before its product)."""
        return self.x.shape

    @property
    def device(self) -> torch.device:
        """Where the activations are."""
        return self.x.device


def prepare_x_f16_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, K] as mode "f16" of the packed products takes it (`triton_gguf_f16.prepare_x`): (x16 [T, K],
    xmean16 [T, K / 32], scale [T]), float32 tensors holding float16 values and powers of two: per row
    e = max(0, floor(log2(max|x|)) - 14), x16 = float16(x * 2**-e), xmean16 = float16(mean of x16 over
    each 32 columns), scale = 2**e."""
    xf = x.float()
    top = xf.abs().amax(dim=1)
    _, exponent = torch.frexp(top)  # top = mantissa * 2**exponent, mantissa in [0.5, 1)
    e = torch.clamp(torch.where(top > 0, exponent - 1, torch.zeros_like(exponent)) - 14, min=0)
    x16 = (xf * torch.exp2(-e.float())[:, None]).half().float()
    xmean = x16.reshape(x.shape[0], -1, 32).mean(dim=-1).half().float()
    return x16, xmean, torch.exp2(e.float())


def repacked_f16_linear_ref(x: torch.Tensor, weight: RepackedMatrix) -> torch.Tensor:
    """x [T, K] @ weight.T (Q4_K or Q5_K) as mode "f16" computes it, in float64 from `prepare_x_f16_ref`'s
    rounding: y = scale * (sum over sub-blocks of s * (codes . x16) - o * 32 * xmean16), s and o the
    sub-block's scale and offset (`sub_block_scales`). Off the exact product only by x's and the means'
    rounding to float16; the kernel adds float32 sums on top."""
    if weight.qtype not in F16_TYPES:
        raise ValueError(f'mode "f16" takes {" and ".join(F16_TYPES)}, not {weight.qtype}')
    x16, xmean, scale = prepare_x_f16_ref(x)
    s, o, size = sub_block_scales(weight)
    q = sub_block_codes(weight).double().reshape(weight.rows, -1, size)
    dots = torch.einsum("tsk,nsk->tns", x16.double().reshape(x.shape[0], -1, size), q)
    y = (s.double()[None] * dots - o.double()[None] * (32.0 * xmean.double())[:, None, :]).sum(dim=-1)
    return (y * scale.double()[:, None]).to(x.dtype)


# The types mode "f16s" takes: F16_TYPES, and Q6_K, whose scale times code can pass float16's 11
# significant bits (signed 8-bit scales times 6-bit codes), so its weights are rounded like f16s's:
# float16(float16(d * scale) * (code - 32)).
F16S_TYPES = F16_TYPES + ("Q6_K",)


def repacked_f16s_q6_k_linear_ref(x: torch.Tensor, weight: RepackedMatrix) -> torch.Tensor:
    """x [T, K] @ weight.T (Q6_K) as mode "f16s" computes it, in float64 from `prepare_x_f16_ref`'s x16
    and the kernel's float16 weights float16(float16(d * scale) * (code - 32)) (Q6_K has no minimums,
    so the sub-block means play no part); the kernel adds float32 sums on top."""
    if weight.qtype != "Q6_K":
        raise ValueError(f"this reference is Q6_K's, not {weight.qtype}'s")
    x16, _, scale = prepare_x_f16_ref(x)
    s, _, size = sub_block_scales(weight)
    q = sub_block_codes(weight).float().reshape(weight.rows, -1, size)
    w16 = (s.half().float()[..., None] * q).half().double().reshape(weight.rows, -1)
    return ((x16.double() @ w16.T) * scale.double()[:, None]).to(x.dtype)


def repacked_g16_linear_ref(x: torch.Tensor, weight: RepackedMatrix) -> torch.Tensor:
    """x [T, K] @ weight.T (Q4_K or Q6_K) as mode "g16" (`gluon_gguf_g16`) computes it, in float64 from
    `prepare_x_f16_ref`'s x16 and the kernel's float16 weights, each rounded once: Q4_K float16(code *
    float16(d * scale) - float16(dmin * min)) (one HFMA; the minimums folded into the weights), Q6_K as
    mode "f16s" rounds them (`repacked_f16s_q6_k_linear_ref`); the kernel adds float32 sums on top."""
    if weight.qtype == "Q6_K":
        return repacked_f16s_q6_k_linear_ref(x, weight)
    if weight.qtype != "Q4_K":
        raise ValueError(f'mode "g16" takes Q4_K and Q6_K, not {weight.qtype}')
    x16, _, scale = prepare_x_f16_ref(x)
    s, o, size = sub_block_scales(weight)
    q = sub_block_codes(weight).double().reshape(weight.rows, -1, size)
    w16 = (s.half().double()[..., None] * q - o.half().double()[..., None]).half().double().reshape(weight.rows, -1)
    return ((x16.double() @ w16.T) * scale.double()[:, None]).to(x.dtype)


# The types mode "h2" of the packed products takes (one row in float16 pairs: Q4_K's scale times code is
# exact in float16, Q6_K's rounds to 11 significant bits where it exceeds 2,048).
H2_TYPES = ("Q4_K", "Q6_K")


def prepare_x_h2_ref(x: torch.Tensor, groups_per_slice: int, group: int = 256) -> tuple[torch.Tensor, torch.Tensor,
                                                                                       torch.Tensor]:
    """One activation row x [1, K] as mode "h2" of the packed products takes it (`triton_gguf_h2`), cut
    into slices of `groups_per_slice` groups of `group` columns (one slice per split-K program): (x16 [1, K], xsum
    [1, K * 8 / group], scale [K / group / groups_per_slice]) float32 tensors: per slice e = clamp(floor(log2(
    max|x|)) - 12, -126, 126) (so max |x16| is in [2**12, 2**13)), x16 = float16(x * 2**-e), xsum = each
    sub-block's (group / 8 columns) sum of x16, scale = 2**e."""
    xf = x.float().reshape(-1, groups_per_slice * group)
    top = xf.abs().amax(dim=1)
    _, exponent = torch.frexp(top)  # top = mantissa * 2**exponent, mantissa in [0.5, 1): floor(log2) = exponent - 1
    e = torch.clamp(torch.where(top > 0, exponent - 13, torch.full_like(exponent, -126)), -126, 126).double()
    x16 = (xf.double() * torch.exp2(-e)[:, None]).float().half().float()
    xsum = x16.double().reshape(-1, group // 8).sum(dim=-1).float()  # eight sub-blocks a group
    return x16.reshape(1, -1), xsum.reshape(1, -1), torch.exp2(e).float()


def repacked_h2_linear_ref(x: torch.Tensor, weight: RepackedMatrix, groups_per_slice: int) -> torch.Tensor:
    """x [1, K] @ weight.T (Q4_K or Q6_K) as mode "h2" computes it, in float64 from `prepare_x_h2_ref`'s
    rounding (slices of `groups_per_slice` groups: 256 columns for Q4_K, 128 for Q6_K): y = sum over
    slices of scale * sum over sub-blocks of (s * (codes . x16) - o * xsum) (`sub_block_scales`,
    `sub_block_codes`). Off the exact product by x's rounding to float16; the kernel adds float16 sums
    (and for Q6_K each weight's rounding to 11 significant bits) on top."""
    if weight.qtype not in H2_TYPES:
        raise ValueError(f'mode "h2" takes {" and ".join(H2_TYPES)}, not {weight.qtype}')
    x16, xsum, scale = prepare_x_h2_ref(x, groups_per_slice, GROUPING[weight.qtype][0])
    s, o, size = sub_block_scales(weight)
    q = sub_block_codes(weight).double().reshape(weight.rows, -1, size)
    dots = torch.einsum("sk,nsk->ns", x16.double().reshape(-1, size), q)
    per_sub = s.double() * dots - o.double() * xsum.double()  # [rows, sub-blocks]
    per_slice = per_sub.reshape(weight.rows, scale.numel(), -1).sum(dim=-1)
    return (per_slice * scale.double()[None]).sum(dim=-1, keepdim=True).T.to(x.dtype)


def quantize_sub_blocks_i8(x: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] rounded to int8 per sub-block of `size` columns, as mode "i8" of `triton_gguf_repacked`
    rounds it: (xq float32 [T, K / size, size] holding integers in -127..127, dx float32 [T, K / size])
    with dx = max|x| / 127 and xq = floor(x * (127 / max|x|) + 0.5) (all zeros where max|x| is 0)."""
    xs = x.float().reshape(x.shape[0], -1, size)
    amax = xs.abs().amax(dim=-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.floor(xs * inv[..., None] + 0.5), amax / 127.0


def repacked_i8_linear_ref(x: torch.Tensor, weight: RepackedMatrix,
                           rounded: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [T, K] @ weight.T as mode "i8" of `triton_gguf_repacked` computes it: x rounded to int8 per
    sub-block (`quantize_sub_blocks_i8`, or `rounded` = (xq, dx) as given: a kernel's rounding, which
    may differ by one step where x / dx lands on a half), S = the exact integer dot of the codes
    (signed for Q8_0 and Q6_K) with xq per sub-block, then y = sum over sub-blocks of
    scale * (dx * S) - offset * sum(x), in float32. Against `repacked_linear_ref` the error is x's
    rounding (a half step dx / 2 per value at most), as llama.cpp's int8-activation kernels have it."""
    scale, offset, size = sub_block_scales(weight)
    q = sub_block_codes(weight).to(torch.int64)
    xq, dx = rounded if rounded is not None else quantize_sub_blocks_i8(x, size)  # [T, S, size], [T, S]
    dots = torch.einsum("tsk,nsk->tns", xq.to(torch.int64), q.reshape(weight.rows, -1, size)).float()
    xsum = x.float().reshape(x.shape[0], -1, size).sum(dim=-1)
    return (scale[None] * (dx[:, None, :] * dots) - offset[None] * xsum[:, None, :]).sum(dim=-1).to(x.dtype)
