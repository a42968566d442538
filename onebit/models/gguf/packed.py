"""Linear layers whose GGUF weights stay packed on the device (`--gguf-keep-packed`).

A decoder `Linear` (and an untied LM head) is kept packed when every GGUF tensor that fills it is
of a type the kernels read (`gguf_quants.PACKED_TYPES`: Q8_0, Q4_K, Q5_K, Q6_K) with whole
kernel steps per row; fused q/k/v and gate/up rows may mix types (a Q4_K_M file's attn_v is often
Q6_K), giving one part per run of rows of one type. Everything else (embeddings, norms, other
types, a tied LM head, which is the embedding table) is dequantized at load as before.

The model is built on the meta device, the chosen layers swapped for `PackedGGUFLinear` shells,
and only then given storage, so no bf16 copy of a packed weight ever exists. Once filled, each layer
is repacked (`repack_packed`, when REPACK) into `gguf_repack`'s layout, which the few-row kernels
of `triton_gguf_repacked` stream several times faster than the file's block layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from onebit.kernels import gguf_quants
from onebit.kernels.gguf_quants import PackedMatrix
from onebit.kernels.gguf_repack import F16Rows, RepackedMatrix
from onebit.models.gguf.files import GGUFFile
from onebit.models.gguf.weights import CHUNK_ELEMENTS, unpermute_rows
from onebit.models.layers import Linear, RMSNorm
from onebit.models.loader import param_target


# Repack the filled layers into gguf_repack's GPU layout (same values); False keeps the file's blocks
# and the first kernels (triton_gguf).
REPACK = True


class PackedGGUFLinear(nn.Module):
    """x @ W.T + bias with W [out_features, in_features] held as GGUF blocks, in parts of one type each.

    parts: (qtype, rows) per run of rows, in order; the bytes are buffers `part{i}_quants`,
    `part{i}_scales`, `part{i}_d` (uninitialised until filled by the loader), after `repack`
    `part{i}_codes`, `part{i}_high`, `part{i}_scales`, `part{i}_d` (`gguf_repack.RepackedMatrix`)."""

    def __init__(self, in_features: int, parts: list[tuple[str, int]], bias: bool):
        super().__init__()
        self.in_features = in_features
        self.out_features = sum(rows for _, rows in parts)
        self.part_types = [(qtype, rows) for qtype, rows in parts]
        for i, (qtype, rows) in enumerate(parts):
            empty = PackedMatrix.empty(qtype, rows, in_features, device=None)
            self.register_buffer(f"part{i}_quants", empty.quants)
            self.register_buffer(f"part{i}_scales", empty.scales)
            self.register_buffer(f"part{i}_d", empty.d)
        self.bias = nn.Parameter(torch.empty(self.out_features)) if bias else None

        self.repacked = False

    @property
    def parts(self) -> list:
        """The weight's parts, on the buffers' current storage: `PackedMatrix` (the file's bytes), or
        `RepackedMatrix` once `repack` has run."""
        if self.repacked:
            return [RepackedMatrix(qtype, rows, self.in_features, *(getattr(self, f"part{i}_{name}")
                                                                   for name in ("codes", "high", "scales", "d")))
                    for i, (qtype, rows) in enumerate(self.part_types)]
        return [PackedMatrix(qtype, rows, self.in_features, getattr(self, f"part{i}_quants"),
                             getattr(self, f"part{i}_scales"), getattr(self, f"part{i}_d"))
                for i, (qtype, rows) in enumerate(self.part_types)]

    def repack(self) -> None:
        """Regroup every part's bytes into the GPU layout of `gguf_repack` (same values, one part at a
        time, so the extra memory is one part's)."""
        if self.repacked:
            return
        for i, part in enumerate(self.parts):
            repacked = RepackedMatrix.from_packed(part)
            for name in ("quants", "scales", "d"):
                delattr(self, f"part{i}_{name}")
            for name, tensor in repacked.tensors.items():
                self.register_buffer(f"part{i}_{name}", tensor)
        self.repacked = True

    def takes_f16_rows(self, rows: int, device: torch.device) -> bool:
        """Whether a producer should hand this product `F16Rows` for this many rows: on CUDA, when one of
        its repacked parts runs them in mode "f16"/"f16s" (`triton_gguf_repacked.reads_f16_rows`)."""
        if device.type != "cuda" or not self.repacked or self.in_features % 256:
            return False
        from onebit.kernels import triton_gguf_repacked

        return any(triton_gguf_repacked.reads_f16_rows(part, rows) for part in self.parts)

    def forward(self, x: torch.Tensor | F16Rows) -> torch.Tensor:
        """x @ W.T + bias (Triton kernels on CUDA, the dequantizing reference elsewhere); x may come as
        `F16Rows` from a `PackedInputNorm`."""
        return gguf_quants.packed_linear(x, self.parts, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, parts={self.part_types}"


class PackedInputNorm(RMSNorm):
    """An RMSNorm whose only reader is a `PackedGGUFLinear`: for the row counts that product runs in mode
    "f16"/"f16s", the norm's kernel also makes the float16 copy, sub-block means and scale those
    modes read (`triton_gguf_f16.add_rms_norm_f16`) and returns `F16Rows`, so no `prepare_x` launch
    runs before the product (G23, session 19: 0.22 / 0.47 ms a step at B = 8 / 64)."""

    consumer: PackedGGUFLinear  # set by `fuse_f16_inputs`; a plain attribute, not a submodule

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """As `RMSNorm.forward`, the normalized rows as `F16Rows` when the consumer reads them."""
        if x.dim() == 2 and x.is_contiguous() and self.consumer.takes_f16_rows(x.shape[0], x.device):
            from onebit.kernels import triton_gguf_f16

            rows, summed = triton_gguf_f16.add_rms_norm_f16(x, residual, self.weight, self.eps)
            return rows if residual is None else (rows, summed)
        return super().forward(x, residual)


def fuse_f16_inputs(model: nn.Module) -> int:
    """Turn each decoder layer's RMSNorms before qkv and gate_up into `PackedInputNorm`s where the
    product after them is a `PackedGGUFLinear` (same parameters, same names; the class changes in
    place); returns how many."""
    fed = 0
    for layer in model.modules():
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        for norm, product in ((getattr(layer, "input_layernorm", None), getattr(attn, "qkv_proj", None)),
                              (getattr(layer, "post_attention_layernorm", None), getattr(mlp, "gate_up_proj", None))):
            if type(norm) is RMSNorm and isinstance(product, PackedGGUFLinear):
                norm.__class__ = PackedInputNorm
                object.__setattr__(norm, "consumer", product)  # not registered as a second parent of it
                fed += 1
    return fed


@dataclass
class Segment:
    """Rows [start, start + rows) of a packed layer, filled from GGUF tensor `name`."""

    name: str
    qtype: str
    start: int
    rows: int
    head_rows: int  # llama's Q/K rows to unpermute in groups of this many, or 0


def plan_packed(model: nn.Module, gfile: GGUFFile, cfg, rename) -> dict[str, list[Segment]]:
    """Module name -> its segments, for every `Linear` of `model` that can be kept packed."""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    permuted = gfile.architecture == "llama"
    found: dict[str, list[Segment]] = {}
    refused: set[str] = set()
    for name, tensor in gfile.tensors.items():
        local = rename(name)
        if local is None or not local.endswith(".weight"):
            continue
        param, start, size, ours = param_target(local, cfg, params)
        module_name = ours[:-len(".weight")]
        if param is None or not isinstance(modules.get(module_name), Linear):
            continue
        qtype = tensor.tensor_type.name
        if not gguf_quants.can_pack(qtype, param.shape[1]):
            refused.add(module_name)
            continue
        head_rows = cfg.head_dim if permuted and (".q_proj." in local or ".k_proj." in local) else 0
        found.setdefault(module_name, []).append(
            Segment(name, qtype, start or 0, size if size is not None else param.shape[0], head_rows))
    plans = {}
    for module_name, segments in found.items():
        segments.sort(key=lambda s: s.start)
        rows = modules[module_name].weight.shape[0]
        covered = sum(s.rows for s in segments)
        if module_name not in refused and covered == rows and segments[0].start == 0:
            plans[module_name] = segments
    return plans


def _runs(segments: list[Segment]) -> list[tuple[str, int]]:
    """(qtype, rows) of each run of consecutive segments of one type."""
    runs: list[list] = []
    for s in segments:
        if runs and runs[-1][0] == s.qtype:
            runs[-1][1] += s.rows
        else:
            runs.append([s.qtype, s.rows])
    return [(qtype, rows) for qtype, rows in runs]


def swap_in_packed(model: nn.Module, plans: dict[str, list[Segment]]) -> None:
    """Replace each planned `Linear` of `model` (on the meta device) by a `PackedGGUFLinear` shell."""
    for module_name, segments in plans.items():
        layer = model.get_submodule(module_name)
        parent_name, _, child = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedGGUFLinear(layer.in_features, _runs(segments), layer.bias is not None))


def skipping_packed(rename, plans: dict[str, list[Segment]]):
    """`rename`, but None (skip) for the GGUF tensors the packed layers take."""
    taken = {s.name for segments in plans.values() for s in segments}
    return lambda name: None if name in taken else rename(name)


def fill_packed(model: nn.Module, gfile: GGUFFile, plans: dict[str, list[Segment]]) -> None:
    """Copy each packed layer's block bytes from the file into its buffers, in row chunks."""
    for module_name, segments in plans.items():
        layer: PackedGGUFLinear = model.get_submodule(module_name)
        parts = layer.parts
        part_start = [0]
        for part in parts:
            part_start.append(part_start[-1] + part.rows)
        for s in segments:
            index = max(i for i in range(len(parts)) if part_start[i] <= s.start)
            part, offset = parts[index], s.start - part_start[index]
            step = max(1, CHUNK_ELEMENTS // layer.in_features)
            if s.head_rows:
                step = max(s.head_rows, step // s.head_rows * s.head_rows)
            for first in range(0, s.rows, step):
                last = min(first + step, s.rows)
                raw = torch.from_numpy(gfile.read_rows(s.name, first, last).reshape(last - first, -1))
                if s.head_rows:
                    raw = unpermute_rows(raw, s.head_rows)
                part.fill(offset + first, raw)


def repack_packed(model: nn.Module, plans: dict[str, list[Segment]]) -> None:
    """Repack every planned (filled) layer of `model` into the GPU layout (`PackedGGUFLinear.repack`),
    then let the norms before the repacked products prepare their float16 input (`fuse_f16_inputs`)."""
    for module_name in plans:
        model.get_submodule(module_name).repack()
    fuse_f16_inputs(model)
