"""Quantizing a loaded model's linear layers in place (`--quantize fp8`).

Every decoder `Linear` (attention projections and MLP) becomes an `Fp8Linear`: its weight is
quantized per output channel to e4m3 on the device, one layer at a time, and the bf16 copy is
freed, so the peak is the unquantized model plus one layer. The output head is quantized the same
way with `head=True` (`--quantize-lm-head`, on by default: its error reaches every logit, and
costs +0.07-0.14 points of held-out perplexity on the demo model, docs/perf.md). A tied head (the embedding's matrix) gets an e4m3 copy
of its own: the embedding lookup keeps the run dtype.

With FP8 products, the producers `FUSED_PRODUCERS` names become their fused forms: the RMSNorms before
the attention's qkv and the MLP's gate_up (`Fp8InputNorm`), the SiLU * mul before down (`Fp8SwiGLU`), the
decode attention before o (`Fp8Attention`). When the product takes e4m3 rows in the form its producer
emits for the step's row count (`fp8.FED_KINDS`: a scale per row from the norms for `_scaled_mm` or the
w8a8 split-K kernel, a scale per row and block from SiLU * mul and the attention for the split-K
kernel's block form; with `fp8.FUSE_QUANT`),
they emit e4m3 rows and scales (`fp8.Fp8Rows`) in the same kernel, and no separate quantizer runs.
"""

from __future__ import annotations

import torch
from torch import nn

from onebit.kernels import fp8
from onebit.kernels.attention import AttentionMetadata, decode_quantizes, paged_decode_attention_quantized
from onebit.models.layers import Linear, RMSNorm, SwiGLU
from onebit.models.transformer import Attention

METHODS = ("fp8",)
# The producers `fuse_input_quantization` fuses with the quantizer ("norm": the RMSNorms before qkv
# and gate_up; "silu": SiLU * mul before down). Session 14 on the H200 (G31): add + RMSNorm +
# quantize in one kernel ran 1.32-1.41x faster than the pair at 1-256 rows, SiLU * mul + quantize
# (one scale a row then, one program a row) 0.74-0.83x (1.02x at 64 rows), and the fp8 engine with
# both fused gained 2.2% at B=64 and lost 1.2% at B=256. So the norms only (still behind
# `fp8.FUSE_QUANT`, on since session 15 measured it: B=64 +1.9%, B=256 flat). Session 25 rebuilt the
# SiLU one with a scale per row and block, one program a block, for the split-K kernel's block form;
# session 26: down fed by it 18.3 us at 64 rows (20.9 quantizing its own input, 23.3 per row before),
# FP8 B=64 +4.4% and B=32 +2.9% with the block form (three runs a side), so both are fused.
# "attention" (built after session 26's device time, not yet measured, so not named here): a
# decode-only step's attention kernel writes o's input block-quantized (`Fp8Attention`), where one
# KV head's group of query heads is one block (Qwen3-8B, Llama-3-8B: 4 x 128 = 512 values).
FUSED_PRODUCERS = ("norm", "silu")


class Fp8Linear(nn.Module):
    """A linear layer whose weight is e4m3 with one float32 scale per output channel."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("weight_scale", scale)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.out_features, self.in_features = qweight.shape
        # The form of e4m3 rows the producer of x emits ("rows", "blocks"; `fuse_input_quantization`),
        # "" when x always arrives in the model's dtype.
        self.fed = ""

    @classmethod
    def from_linear(cls, layer: nn.Linear) -> "Fp8Linear":
        """Quantize `layer`'s weight (on its device)."""
        return cls.from_weight(layer.weight, layer.bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Fp8Linear":
        """Quantize a weight [N, K] (on its device); `weight` itself is left as it is."""
        q, scale = fp8.quantize_rows(weight.detach())
        return cls(q, scale, bias.detach() if bias is not None else None)

    def takes_quantized_rows(self, rows: int, device: torch.device) -> bool:
        """Whether this product, fed by a fusing producer, wants `fp8.Fp8Rows` for this many rows."""
        return bool(self.fed) and fp8.takes_quantized_rows(rows, self.out_features, self.in_features,
                                                           self.bias is not None, device, self.fed)

    def forward(self, x: torch.Tensor | fp8.Fp8Rows) -> torch.Tensor:
        """x @ (qweight * scale).T + bias (x in the model's dtype, or rows already in e4m3)."""
        return fp8.linear(x, self.qweight, self.weight_scale, self.bias, self.fed)

    def silu_mul(self, x: torch.Tensor | fp8.Fp8Rows) -> torch.Tensor | None:
        """silu(gate) * up of this [gate | up] product in one kernel where that applies
        (`fp8.linear_silu_mul`), else None."""
        return fp8.linear_silu_mul(x, self.qweight, self.weight_scale, self.bias, self.fed)


class Fp8InputNorm(RMSNorm):
    """An RMSNorm whose only reader is an `Fp8Linear`: for the row counts that product takes
    e4m3 rows at (`fp8.takes_quantized_rows`), the norm's kernel also quantizes its result and returns `fp8.Fp8Rows`."""

    consumer: Fp8Linear  # set by `fuse_input_quantization`; a plain attribute, not a submodule

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """As `RMSNorm.forward`, the normalized rows as `fp8.Fp8Rows` when the consumer wants them."""
        if x.dim() == 2 and self.consumer.takes_quantized_rows(x.shape[0], x.device):
            rows, summed = fp8.add_rms_norm_quantize(x, residual, self.weight, self.eps)
            return rows if residual is None else (rows, summed)
        return super().forward(x, residual)


class Fp8Attention(Attention):
    """Attention whose o product is an `Fp8Linear` fed block-scaled e4m3 rows: at the row counts o takes
    them, a decode-only step's attention kernel writes its output quantized (one scale per row and
    KV head's group of query heads, `fp8.ACTIVATION_BLOCK` values), and o's quantizer launch goes."""

    def attend(self, q: torch.Tensor, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        """As `Attention.attend`, o fed `fp8.Fp8Rows` where it takes them."""
        if decode_quantizes(q, meta) and self.o_proj.takes_quantized_rows(q.shape[0], q.device):
            rows = paged_decode_attention_quantized(q, k_cache, v_cache, meta, self.scale, fp8.ACTIVATION_BLOCK,
                                                    self.k_scale, self.v_scale)
            return self.o_proj(fp8.Fp8Rows(*rows, q.dtype, fp8.ACTIVATION_BLOCK))
        return super().attend(q, k_cache, v_cache, meta)


class Fp8SwiGLU(SwiGLU):
    """A SwiGLU MLP with FP8 products: for the row counts its down product takes e4m3
    rows with a scale per row and block at, SiLU * mul emits them in one kernel; where gate_up can apply
    SiLU * mul itself (`fp8.linear_silu_mul`: one row), it does."""

    def forward(self, x: torch.Tensor | fp8.Fp8Rows) -> torch.Tensor:
        """down(silu(gate(x)) * up(x))."""
        if self.down_proj.takes_quantized_rows(x.shape[0], x.device):  # (`Fp8Rows` has both too)
            return self.down_proj(fp8.silu_mul_quantize(self.gate_up_proj(x)))
        return self.down_proj(self.activated(x))


def fp8_layers(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Every `Fp8Linear` of `model` by name: (qweight, weight_scale, bias), for `fp8.calibrate`."""
    return {name: (m.qweight, m.weight_scale, m.bias) for name, m in model.named_modules() if isinstance(m, Fp8Linear)}


def fed_layers(model: nn.Module) -> dict[str, str]:
    """The `Fp8Linear`s whose producer emits e4m3 rows, by name: the form it emits ("rows", "blocks";
    for `fp8.calibrate`)."""
    return {name: m.fed for name, m in model.named_modules() if isinstance(m, Fp8Linear) and m.fed}


def fuse_input_quantization(model: nn.Module) -> int:
    """Turn each decoder layer's RMSNorms before qkv and gate_up, its SwiGLU and its attention into the
    fused forms where the product after them is an `Fp8Linear` (those of `FUSED_PRODUCERS`); returns how
    many products it feeds.
    The modules change class in place (same parameters, same names): `Fp8InputNorm`, `Fp8SwiGLU` and
    `Fp8Attention` only override how they run."""
    fed = 0
    for layer in model.modules():
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        pairs = [(getattr(layer, "input_layernorm", None), getattr(attn, "qkv_proj", None)),
                 (getattr(layer, "post_attention_layernorm", None), getattr(mlp, "gate_up_proj", None))]
        for norm, product in pairs:
            if "norm" in FUSED_PRODUCERS and type(norm) is RMSNorm and isinstance(product, Fp8Linear):
                norm.__class__ = Fp8InputNorm
                object.__setattr__(norm, "consumer", product)  # not registered as a second parent of it
                product.fed = "rows"
                fed += 1
        if "silu" in FUSED_PRODUCERS and type(mlp) is SwiGLU and isinstance(mlp.down_proj, Fp8Linear):
            mlp.__class__ = Fp8SwiGLU
            mlp.down_proj.fed = "blocks"
            fed += 1
        if "attention" in FUSED_PRODUCERS and type(attn) is Attention and isinstance(attn.o_proj, Fp8Linear) \
                and attn.num_heads // attn.num_kv_heads * attn.head_dim == fp8.ACTIVATION_BLOCK:
            attn.__class__ = Fp8Attention  # one block a KV head's group of query heads (Qwen3-8B: 4 x 128)
            attn.o_proj.fed = "blocks"
            fed += 1
    return fed


def quantize_model(model: nn.Module, method: str, head: bool = False) -> int:
    """Replace every decoder `Linear` of `model` by its quantized form (and the output head with
    `head`: a tied one gets an e4m3 copy, the embedding stays); returns how many. The decoder
    layers' norms and MLPs then feed the products e4m3 rows where those take them
    (`fuse_input_quantization`)."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization {method!r}; choose one of {', '.join(METHODS)}")
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, Linear) and name.rpartition(".")[2] != "lm_head"]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, Fp8Linear.from_linear(module))
        del module
    count = len(targets)
    if head and hasattr(model, "lm_head"):
        if isinstance(model.lm_head, nn.Linear):
            model.lm_head = Fp8Linear.from_linear(model.lm_head)
            count += 1
        elif model.lm_head is None and isinstance(getattr(model, "embed_tokens", None), nn.Embedding):
            # Tied: `compute_logits` multiplies by a head when there is one; the lookup reads the embedding.
            model.lm_head = Fp8Linear.from_weight(model.embed_tokens.weight)
            count += 1
    fuse_input_quantization(model)
    return count
