"""GGUF block quantizations kept packed: their layouts, a plain-torch dequantizer and product.

A GGUF matrix [N, K] stores each row as K / B blocks of B values (B = 32 for Q8_0, 256 for the
K-quants), each block a fixed number of bytes (llama.cpp's ggml-common.h):
- Q8_0 (34 bytes): f16 d, 32 x int8 q;                          value = d * q
- Q4_K (144): f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes of nibbles;
  value = d * scale[sub] * q - dmin * min[sub], sub-blocks of 32
- Q5_K (176): as Q4_K plus 32 bytes holding each value's fifth bit before the nibbles
- Q6_K (210): 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales, f16 d;
  value = d * scale[sub] * (q - 32), sub-blocks of 16

`PackedMatrix` keeps exactly those bytes on the device, regrouped by field (all rows' quants, all
scales, all d's: `split_blocks`) so that every kernel load is aligned (34- and 210-byte blocks
are not). `dequantize_blocks` is the reference: it equals `gguf.quants.dequantize` bit for bit
(same float32 operations in the same order). `packed_linear` multiplies by a weight made of
`PackedMatrix` parts (e.g. fused q/k/v rows of different types): the Triton kernels
(`triton_gguf`) on CUDA, else dequantize-then-`F.linear` in the activations' dtype, which gives
exactly what a model dequantized at load computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

QK_K = 256


@dataclass(frozen=True)
class BlockLayout:
    """One quantization's block: values and bytes per block, and how its bytes split into fields.

    quants: (start, stop) byte ranges, in order, of the bulk bits; scales: the packed sub-block
    scale bytes (empty for Q8_0); d: the byte range of the f16 super-scale(s) (d, then dmin)."""

    values: int
    nbytes: int
    quants: tuple[tuple[int, int], ...]
    scales: tuple[int, int]
    d: tuple[int, int]
    step: int  # the kernels walk K in steps of this many values; K must be a multiple

    @property
    def quant_bytes(self) -> int:
        """Bytes of bulk bits per block."""
        return sum(stop - start for start, stop in self.quants)

    @property
    def scale_bytes(self) -> int:
        """Bytes of sub-block scales per block."""
        return self.scales[1] - self.scales[0]

    @property
    def d_count(self) -> int:
        """f16 super-scales per block (1, or 2 with dmin)."""
        return (self.d[1] - self.d[0]) // 2


LAYOUTS = {
    "Q8_0": BlockLayout(32, 34, ((2, 34),), (34, 34), (0, 2), step=128),
    "Q4_K": BlockLayout(QK_K, 144, ((16, 144),), (4, 16), (0, 4), step=QK_K),
    "Q5_K": BlockLayout(QK_K, 176, ((16, 176),), (4, 16), (0, 4), step=QK_K),
    "Q6_K": BlockLayout(QK_K, 210, ((0, 192),), (192, 208), (208, 210), step=QK_K),
}
PACKED_TYPES = tuple(LAYOUTS)


def can_pack(qtype: str, cols: int) -> bool:
    """True when a [*, cols] matrix of `qtype` can stay packed (a kept type, rows a whole number of steps)."""
    layout = LAYOUTS.get(qtype)
    return layout is not None and cols % layout.step == 0


def row_bytes(qtype: str, cols: int) -> int:
    """Bytes of one stored row of `cols` values."""
    layout = LAYOUTS[qtype]
    return cols // layout.values * layout.nbytes


# ---------------------------------------------------------------------------------------------
# The reference dequantizer (raw blocks -> float32), mirroring gguf.quants' numpy code.


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian f16 from [..., 2k] bytes, as float32 [..., k]."""
    return raw.contiguous().view(torch.float16).float()


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: the eight 6-bit (scale, min) pairs of [n, 12] bytes, each [n, 8] uint8."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _nibbles(qs: torch.Tensor, n: int) -> torch.Tensor:
    """[n, 4 x 32] bytes -> [n, 8, 32]: sub-block 2c the low nibbles of chunk c, 2c+1 the high."""
    chunks = qs.reshape(n, 4, 1, 32)
    return torch.cat([chunks & 0x0F, chunks >> 4], dim=2).reshape(n, 8, 32)


def _dequantize_q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _dequantize_k4(b: torch.Tensor, fifth_bit: bool) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    scale = (d * sc.float()).reshape(n, 8, 1)
    offset = (dmin * mn.float()).reshape(n, 8, 1)
    q = _nibbles(b[:, 48:176] if fifth_bit else b[:, 16:144], n)
    if fifth_bit:
        shifts = torch.arange(8, dtype=torch.uint8, device=b.device).reshape(1, 8, 1)
        high = (b[:, 16:48].reshape(n, 1, 32) >> shifts) & 1
        q = q | (high << 4)
    return (scale * q.float() - offset).reshape(n, QK_K)


def _dequantize_q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh = b[:, 0:128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    scale = (_f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    low = ql.reshape(n, 2, 1, 64)
    low = torch.cat([low & 0x0F, low >> 4], dim=2).reshape(n, 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).reshape(1, 1, 4, 1)
    high = ((qh.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 8, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
    return (scale * q).reshape(n, QK_K)


_DEQUANTIZE = {"Q8_0": _dequantize_q8_0, "Q4_K": lambda b: _dequantize_k4(b, False),
               "Q5_K": lambda b: _dequantize_k4(b, True), "Q6_K": _dequantize_q6_k}


def dequantize_blocks(raw: torch.Tensor, qtype: str) -> torch.Tensor:
    """Rows of raw GGUF blocks (uint8 [..., row bytes]) as float32 [..., values]; equals
    `gguf.quants.dequantize` exactly."""
    layout = LAYOUTS[qtype]
    if raw.dtype != torch.uint8 or raw.shape[-1] % layout.nbytes:
        raise ValueError(f"{qtype} rows must be uint8 with a multiple of {layout.nbytes} bytes, got "
                         f"{raw.dtype} [..., {raw.shape[-1]}]")
    blocks = raw.reshape(-1, layout.nbytes)
    values = _DEQUANTIZE[qtype](blocks)
    return values.reshape(*raw.shape[:-1], raw.shape[-1] // layout.nbytes * layout.values)


# ---------------------------------------------------------------------------------------------
# The packed weight: the same bytes regrouped by field.


@dataclass
class PackedMatrix:
    """A [rows, cols] GGUF matrix of one type, its block bytes regrouped by field on one device.

    quants: uint8 [rows, blocks x quant bytes]; scales: uint8 [rows, blocks x scale bytes] (Q6_K's
    are int8 values; [rows, 0] for Q8_0); d: float16 [rows, blocks x d_count] (d, then dmin)."""

    qtype: str
    rows: int
    cols: int
    quants: torch.Tensor
    scales: torch.Tensor
    d: torch.Tensor

    @property
    def layout(self) -> BlockLayout:
        """This matrix's block layout."""
        return LAYOUTS[self.qtype]

    @property
    def nbytes(self) -> int:
        """Bytes held (the same as the file's)."""
        return sum(t.numel() * t.element_size() for t in (self.quants, self.scales, self.d))

    @classmethod
    def empty(cls, qtype: str, rows: int, cols: int, device: torch.device | str | None = "cpu") -> "PackedMatrix":
        """Uninitialised storage for a [rows, cols] matrix of `qtype` (filled with `fill`); device None:
        torch's current default device (the meta device while a model is built)."""
        layout = LAYOUTS[qtype]
        if not can_pack(qtype, cols):
            raise ValueError(f"a {qtype} matrix kept packed needs a multiple of {layout.step} columns, got {cols}")
        nb = cols // layout.values
        return cls(qtype, rows, cols,
                   torch.empty(rows, nb * layout.quant_bytes, dtype=torch.uint8, device=device),
                   torch.empty(rows, nb * layout.scale_bytes, dtype=torch.uint8, device=device),
                   torch.empty(rows, nb * layout.d_count, dtype=torch.float16, device=device))

    @classmethod
    def from_blocks(cls, raw: torch.Tensor, qtype: str, cols: int) -> "PackedMatrix":
        """A matrix from its raw rows (uint8 [rows, row bytes]), on raw's device."""
        out = cls.empty(qtype, raw.shape[0], cols, raw.device)
        out.fill(0, raw)
        return out

    def fill(self, start: int, raw: torch.Tensor) -> None:
        """Copy raw block rows (uint8 [n, row bytes], any device) into rows start .. start + n."""
        layout = self.layout
        n = raw.shape[0]
        blocks = raw.to(self.quants.device).reshape(n, -1, layout.nbytes)
        quants = torch.cat([blocks[..., a:b] for a, b in layout.quants], dim=-1)
        self.quants[start:start + n] = quants.reshape(n, -1)
        self.scales[start:start + n] = blocks[..., layout.scales[0]:layout.scales[1]].reshape(n, -1)
        self.d[start:start + n] = blocks[..., layout.d[0]:layout.d[1]].reshape(n, -1).view(torch.float16)

    def blocks(self) -> torch.Tensor:
        """The raw block rows again (uint8 [rows, row bytes]): the inverse of `from_blocks`."""
        layout = self.layout
        nb = self.cols // layout.values
        out = torch.empty(self.rows, nb, layout.nbytes, dtype=torch.uint8, device=self.quants.device)
        quants = self.quants.reshape(self.rows, nb, -1)
        at = 0
        for a, b in layout.quants:
            out[..., a:b] = quants[..., at:at + b - a]
            at += b - a
        out[..., layout.scales[0]:layout.scales[1]] = self.scales.reshape(self.rows, nb, -1)
        out[..., layout.d[0]:layout.d[1]] = self.d.reshape(self.rows, nb, -1).view(torch.uint8)
        return out.reshape(self.rows, -1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The [rows, cols] values in `dtype` (the reference dequantizer, through float32)."""
        return dequantize_blocks(self.blocks(), self.qtype).to(dtype)


try:
    from onebit.kernels import triton_gguf
except ImportError:  # pragma: no cover - depends on the install
    triton_gguf = None


def packed_linear_ref(x: torch.Tensor, parts: list, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] @ the weight stacked from `parts` (rows in order; `PackedMatrix` or
    `gguf_repack.RepackedMatrix`, which dequantize to the same values) .T + bias: each part dequantized to
    x's dtype, then `F.linear` (what a model dequantized at load computes)."""
    weight = torch.cat([p.dequantize(x.dtype) for p in parts]) if len(parts) > 1 else parts[0].dequantize(x.dtype)
    return F.linear(x, weight, bias)


def packed_linear(x, parts: list, bias: torch.Tensor | None = None, kernels: bool | None = None) -> torch.Tensor:
    """x [T, K] @ the weight stacked from `parts` .T + bias: the Triton kernels for 2-D input (`triton_gguf`
    for a PackedMatrix, `triton_gguf_repacked` for a RepackedMatrix; kernels
    None: when x is on CUDA; True also runs them on the CPU, in Triton's interpreter), else the reference.
    x may come as `gguf_repack.F16Rows` (its producer prepared it for modes "f16"/"f16s": the
    repacked parts' kernels take it so, every other path its x)."""
    from onebit.kernels.gguf_repack import F16Rows  # here: gguf_repack imports this module

    plain = x.x if isinstance(x, F16Rows) else x
    if kernels is None:
        kernels = plain.is_cuda
    if kernels and plain.dim() == 2 and triton_gguf is not None:
        from onebit.kernels import triton_gguf_repacked

        y = torch.empty(plain.shape[0], sum(p.rows for p in parts), dtype=plain.dtype, device=plain.device)
        at = 0
        for part in parts:
            if isinstance(part, PackedMatrix):
                triton_gguf.matmul(plain, part, y[:, at:at + part.rows])
            else:
                triton_gguf_repacked.matmul(x, part, y[:, at:at + part.rows])
            at += part.rows
        return y.add_(bias) if bias is not None else y
    return packed_linear_ref(plain, parts, bias)
