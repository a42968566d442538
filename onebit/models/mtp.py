"""The multi-token-prediction head (DeepSeek-V3 / Qwen3-Next layout; tools/mtp_layout.md).

Entry t combines the base model's pre-norm state h_t with the embedding of token t+1 and
runs one decoder layer (its own KV cache, causal over entries) to predict token t+2 through
the shared LM head. The engine stores entry t's K/V at cache position t and rotates it as
position t+1, the position of the token it reads.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from onebit.kernels.attention import AttentionMetadata
from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.layers import Linear, RMSNorm
from onebit.models.loader import build_on_device, fill_from_checkpoint, fill_random, weight_files
from onebit.models.transformer import CausalLM, DecoderLayer


class MTPHead(nn.Module):
    """fc([norm(embed(token t+1)), norm(h_t)]) -> decoder layer -> norm -> shared LM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_fc_norm_embedding = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, base: CausalLM, tokens: torch.Tensor, hidden: torch.Tensor, rope_positions: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, rope):
        """Entries for tokens [N] (token t+1) and hidden [N, H] (h_t); returns (pre-norm output, normed output)."""
        e = self.pre_fc_norm_embedding(base.embed_tokens(tokens))
        x = self.fc(torch.cat([e, self.pre_fc_norm_hidden(hidden)], dim=-1))
        out, residual = self.layers[0](x, None, rope_positions, rope, k_cache, v_cache, meta)
        normed, prenorm = self.norm(out, residual)
        return prenorm, normed


def has_mtp_weights(path: Path) -> bool:
    """True when the checkpoint carries `mtp.*` tensors."""
    from safetensors import safe_open
    for file in weight_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            if any(name.startswith("mtp.") for name in handle.keys()):
                return True
    return False


def load_mtp_head(path: Path, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                  source: Path | None = None, load_format: str = "auto") -> MTPHead:
    """The MTP head from the model's own checkpoint, or from `source` (a safetensors file or directory, or a
    GGUF file in llama.cpp's nextn layout: models/gguf/mtp.py);
    with load_format "dummy" (benchmarks of a model's shape), random weights."""
    if load_format == "dummy" and source is None:
        head = build_on_device(lambda: MTPHead(cfg), device, dtype)
        fill_random(head, seed=1)
        return head.eval()
    if source is not None and source.suffix.lower() == ".gguf" or source is None and path.suffix.lower() == ".gguf":
        from onebit.models.gguf.mtp import fill_mtp_from_gguf

        head = build_on_device(lambda: MTPHead(cfg), device, dtype)
        fill_mtp_from_gguf(head, source or path, cfg, device, dtype)
        return head.eval()
    if source is None:
        if not has_mtp_weights(path):
            raise ModelLoadError(f"{path.name} has no multi-token-prediction head (no mtp.* tensors in its "
                                 "checkpoint): give one with --mtp PATH, or draft with --ngram or --draft-model")
        files = weight_files(path)
    elif source.is_dir():
        files = weight_files(source)
    elif source.is_file():
        files = [source]
    else:
        raise ModelLoadError(f"MTP weights {source} do not exist")
    head = build_on_device(lambda: MTPHead(cfg), device, dtype)

    def rename(name: str) -> str | None:
        return name[len("mtp."):] if name.startswith("mtp.") else None

    fill_from_checkpoint(head, files, cfg, rename, device, dtype, "MTP head")
    return head.eval()
