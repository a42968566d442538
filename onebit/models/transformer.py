"""One decoder-only transformer covering Qwen3, Qwen2, Llama and Mistral.

The forward pass takes a packed step (tokens of many sequences, flattened) and the
paged KV cache; it never sees padding or a batch dimension.
"""

from __future__ import annotations

import torch
from torch import nn

from onebit.kernels import gemv, ops
from onebit.kernels.attention import AttentionMetadata, paged_attention
from onebit.models.config import ModelConfig
from onebit.models.layers import Linear, RMSNorm, SwiGLU


class Attention(nn.Module):
    """Grouped-query self-attention with fused QKV, optional bias and Qwen3's q/k norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.scale = self.head_dim ** -0.5
        # Per-KV-head scales of an e4m3 KV cache ([kv_heads] float32), set at start-up by
        # `onebit.engine.kv_calibration`; None with a cache in the model's dtype.
        self.register_buffer("k_scale", None, persistent=False)
        self.register_buffer("v_scale", None, persistent=False)

    def queries(self, qkv, positions, rope, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        """This step's queries [T, heads, head_dim] (normed and rotated) from its qkv product [T, q + 2 kv],
        after writing its K/V into the cache."""
        has_norm = self.q_norm is not None
        return ops.qk_norm_rope_store(
            qkv, positions, rope[0], rope[1], self.q_norm.weight if has_norm else None,
            self.k_norm.weight if has_norm else None, self.q_norm.eps if has_norm else 0.0,
            meta.slot_mapping, k_cache, v_cache, self.num_heads, self.num_kv_heads, self.head_dim,
            self.k_scale, self.v_scale)

    def attend(self, q: torch.Tensor, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        """o_proj of the queries' attention over the cache: [T, hidden]."""
        return self.o_proj(self.attention_rows(q, k_cache, v_cache, meta))

    def attention_rows(self, q: torch.Tensor, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        """The queries' attention over the cache as o_proj's input rows [T, heads * head_dim]."""
        out = paged_attention(q, k_cache, v_cache, meta, self.scale, self.k_scale, self.v_scale)
        return out.reshape(q.shape[0], self.q_size)

    def forward(self, qkv, positions, rope, k_cache, v_cache, meta: AttentionMetadata):
        """Attend this step's qkv product [T, q + 2 kv] (`qkv_proj` of the normed input: the decoder layer runs
        it, with the norm before it, `DecoderLayer.normed_qkv`) over the cache, after writing its K/V into it."""
        return self.attend(self.queries(qkv, positions, rope, k_cache, v_cache, meta), k_cache, v_cache, meta)


# Fold each decoder layer's two RMSNorm weights into the products after them (qkv, gate_up) at load, so that a
# one-row step runs the layer as four gemv launches with the norms inside them (`DecoderLayer.one_row`: no
# norm kernels; o and down add the residual as they store). Read by the engine's loader (CUDA, bf16/fp16
# weights, no --quantize). On since session 31 (H200, 8B shape, bf16 B=1: 235.6 -> 238.9 tok/s, +1.4%).
FOLD_NORMS = True


class DecoderLayer(nn.Module):
    """Pre-norm attention block followed by a pre-norm SwiGLU block."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.norms_folded = False  # `fold_norms` done

    @torch.no_grad()
    def fold_norms(self) -> bool:
        """Multiply the input norm's weight into qkv_proj's columns and the post-attention norm's into
        gate_up_proj's, and make both norm weights ones (so every other path computes what it did);
        only where both products are plain `Linear` layers. Returns whether it folded."""
        attn, mlp = self.self_attn, self.mlp
        if self.norms_folded or type(attn.qkv_proj) is not Linear or type(mlp.gate_up_proj) is not Linear:
            return False
        for norm, product in ((self.input_layernorm, attn.qkv_proj), (self.post_attention_layernorm, mlp.gate_up_proj)):
            product.weight.copy_(gemv.fold_norm_into(product.weight, norm.weight))
            norm.weight.fill_(1.0)
        self.norms_folded = True
        return True

    def one_row_configs(self) -> tuple | None:
        """The gemv configs of (qkv, o, gate_up, down) when the norms are folded and all four products' one-row
        picks are the gemv kernel (`gemv.one_row_gemv_config`), else None."""
        if not self.norms_folded:
            return None
        products = (self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj)
        configs = tuple(gemv.one_row_gemv_config(p.weight, p.bias) for p in products)
        return None if None in configs else configs

    def one_row(self, h, positions, rope, k_cache, v_cache, meta, configs):
        """The layer over one row of the residual stream h [1, hidden] with folded norms (`one_row_configs`):
        qkv of h / rms(h), the attention, o plus h, gate_up's SiLU * mul of that over its rms, down plus
        that. Returns the next residual stream."""
        attn, mlp = self.self_attn, self.mlp
        c_qkv, c_o, c_gate_up, c_down = configs
        qkv = gemv.gemv_folded(h, attn.qkv_proj.weight, attn.qkv_proj.bias, c_qkv, norm_eps=self.input_layernorm.eps)
        rows = attn.attention_rows(attn.queries(qkv, positions, rope, k_cache, v_cache, meta), k_cache, v_cache, meta)
        h = gemv.gemv_folded(rows, attn.o_proj.weight, attn.o_proj.bias, c_o, residual=h)
        act = gemv.gemv_folded(h, mlp.gate_up_proj.weight, mlp.gate_up_proj.bias, c_gate_up,
                               norm_eps=self.post_attention_layernorm.eps, silu_mul=True)
        return gemv.gemv_folded(act, mlp.down_proj.weight, mlp.down_proj.bias, c_down, residual=h)

    def forward(self, x, residual, positions, rope, k_cache, v_cache, meta):
        """Run the layer; x is the previous block's output, residual the stream before it
        (None for the first layer). Returns the new (x, residual) pair."""
        qkv, residual = self.normed_qkv(x, residual)
        h = self.self_attn(qkv, positions, rope, k_cache, v_cache, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual

    def normed_qkv(self, x, residual):
        """(qkv_proj(input_layernorm(x [+ residual])), the residual stream after it): the norm, then the product
        (which may take the norm's output in another form, e.g. `Fp8InputNorm`'s e4m3 rows)."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm(x, residual)
        return self.self_attn.qkv_proj(h), residual


class CausalLM(nn.Module):
    """The whole model: embeddings, decoder layers, final norm and LM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, rope: tuple[torch.Tensor, torch.Tensor], return_prenorm: bool = False):
        """Hidden states [T, hidden] after the final norm, for packed tokens input_ids [T].

        kv_cache is [2, layers, blocks, block_size, kv_heads, head_dim]; rope is the
        (cos, sin) table, indexed here by position. With return_prenorm, also the last layer's
        output before the final norm (what an MTP head reads).
        """
        x, residual = self.embed_tokens(input_ids), None
        configs = self.one_row_configs() if x.shape[0] == 1 else None
        if configs is not None:  # folded norms, every product on the gemv kernel: the residual stream alone
            for i, (layer, layer_configs) in enumerate(zip(self.layers, configs)):
                x = layer.one_row(x, positions, rope, kv_cache[0, i], kv_cache[1, i], meta, layer_configs)
            normed = self.norm(x)
            return (normed, x) if return_prenorm else normed
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, positions, rope, kv_cache[0, i], kv_cache[1, i], meta)
        normed, prenorm = self.norm(x, residual)
        return (normed, prenorm) if return_prenorm else normed

    def fold_norms(self) -> int:
        """`DecoderLayer.fold_norms` in every layer; returns how many folded."""
        return sum(layer.fold_norms() for layer in self.layers)

    def one_row_configs(self) -> list[tuple] | None:
        """Every layer's `one_row_configs`, or None unless all layers have them."""
        configs = [layer.one_row_configs() for layer in self.layers]
        return None if None in configs else configs

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] for selected hidden states [N, hidden]."""
        if self.lm_head is not None:  # a Linear, or a GGUF head kept packed
            return self.lm_head(hidden)
        return gemv.linear(hidden, self.output_weight())

    def output_weight(self) -> torch.Tensor:
        """The LM head's weight [vocab, hidden] (the embedding's when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def linear_weights(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Every matrix a step multiplies by, by name: (weight, bias)."""
        out = {name: (m.weight, m.bias) for name, m in self.named_modules() if isinstance(m, nn.Linear)}
        if self.lm_head is None or isinstance(self.lm_head, nn.Linear):  # not a packed GGUF head
            out["lm_head"] = (self.output_weight(), None)
        return out
