"""The demo model for training: transformers' Qwen3ForCausalLM plus the MTP head (layout in
tools/mtp_layout.md), with the forward passes training and evaluation need."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm

from tools.demo_training.settings import Settings

def model_config_dict(settings: Settings, vocab: int, tok: Tokenizer) -> dict:
    """The config.json contents (Qwen3ForCausalLM + `num_nextn_predict_layers`)."""
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": settings.hidden,
        "intermediate_size": settings.intermediate,
        "num_hidden_layers": settings.layers,
        "num_attention_heads": settings.heads,
        "num_key_value_heads": settings.kv_heads,
        "head_dim": settings.head_dim,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "rms_norm_eps": settings.rms_norm_eps,
        "rope_theta": settings.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": settings.rope_theta},
        "max_position_embeddings": settings.max_position_embeddings,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "initializer_range": 0.02,
        "bos_token_id": endoftext,
        "eos_token_id": im_end,
        "pad_token_id": endoftext,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 1,
    }


def build_qwen3_config(config: dict) -> Qwen3Config:
    """A float32 Qwen3Config for training from the config.json dict, using SDPA attention."""
    skip = {"architectures", "model_type", "torch_dtype", "rope_theta"}
    return Qwen3Config(**{k: v for k, v in config.items() if k not in skip}, attn_implementation="sdpa")


def _run_layer(layer: nn.Module, x: torch.Tensor, position_embeddings) -> torch.Tensor:
    # attention_mask=None makes HF's SDPA path use is_causal=True (no mask tensor, so the fused
    # kernels apply); `check_causal` verifies that this really is causal.
    out = layer(x, attention_mask=None, position_embeddings=position_embeddings)
    return out[0] if isinstance(out, tuple) else out


class MTPHead(nn.Module):
    """The MTP block: two input RMSNorms, the 2H -> H projection, one Qwen3 decoder layer, a final norm.

    Its parameter names are exactly the `mtp.*` checkpoint names (see tools/mtp_layout.md).
    """

    def __init__(self, config: Qwen3Config):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        # layer_idx 0: HF uses it only to pick a KV-cache slot and the layer type (full attention).
        self.layers = nn.ModuleList([Qwen3DecoderLayer(config, layer_idx=0)])
        self.norm = Qwen3RMSNorm(hidden, eps=eps)


class DemoModel(nn.Module):
    """Qwen3ForCausalLM plus its MTP head, with the forward passes training and evaluation need."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.lm = Qwen3ForCausalLM(config)
        self.mtp = MTPHead(config)
        std = config.initializer_range
        for module in self.mtp.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)

    def base(self, ids: torch.Tensor) -> torch.Tensor:
        """Hidden states of the last decoder layer BEFORE the final norm, [B, T, H].

        Runs the HF modules in HF's order (embedding, rotary, layers); `logits` applies the final
        norm and the LM head. transformers' `output_hidden_states[-1]` is the normed state, so
        it cannot be used for the MTP input.
        """
        inner = self.lm.model
        x = inner.embed_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        rope = inner.rotary_emb(x, positions)
        for layer in inner.layers:
            x = _run_layer(layer, x, rope)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Base-model logits from pre-norm hidden states."""
        return self.lm.lm_head(self.lm.model.norm(hidden))

    def mtp_hidden(self, hidden: torch.Tensor, next_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """MTP decoder-layer output (before `mtp.norm`) for entries t = start, start+1, ...

        Entry t combines `hidden[:, i]` = h_t (pre-norm state at position t) with
        `next_ids[:, i]` = token t+1, runs causally over the entries at rotary position t+1, and
        predicts token t+2.
        """
        mtp = self.mtp
        emb = self.lm.model.embed_tokens(next_ids)
        x = mtp.fc(torch.cat([mtp.pre_fc_norm_embedding(emb), mtp.pre_fc_norm_hidden(hidden)], dim=-1))
        positions = torch.arange(start + 1, start + 1 + x.shape[1], device=x.device).unsqueeze(0)
        rope = self.lm.model.rotary_emb(x, positions)
        for layer in mtp.layers:
            x = _run_layer(layer, x, rope)
        return x

    def mtp_logits(self, mtp_hidden: torch.Tensor) -> torch.Tensor:
        """Logits for token t+2 from MTP outputs (shared LM head)."""
        return self.lm.lm_head(self.mtp.norm(mtp_hidden))

    def losses(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(base loss, MTP loss), mean cross-entropy per token, for windows of seq_len + 1 tokens."""
        ids = window[:, :-1]
        hidden = self.base(ids)
        logits = self.logits(hidden)
        base = F.cross_entropy(logits.flatten(0, 1).float(), window[:, 1:].flatten())
        # Entries t = 0 .. T-2: h_t with token t+1 (both inside `ids`), target token t+2.
        mtp_out = self.mtp_hidden(hidden[:, :-1], ids[:, 1:])
        mtp_logits = self.mtp_logits(mtp_out)
        mtp = F.cross_entropy(mtp_logits.flatten(0, 1).float(), window[:, 2:].flatten())
        return base, mtp

    def export_state(self) -> dict[str, torch.Tensor]:
        """Checkpoint tensors in bf16 under their HF names plus `mtp.*` (tied lm_head left out)."""
        state = {}
        for name, tensor in self.lm.state_dict().items():
            if name == "lm_head.weight" and self.lm.config.tie_word_embeddings:
                continue
            state[name] = tensor
        for name, tensor in self.mtp.state_dict().items():
            state["mtp." + name] = tensor
        return {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in state.items()}


def load_demo(directory: str | Path, device: str | torch.device = "cpu") -> DemoModel:
    """A float32 DemoModel filled from a directory this script wrote (base and `mtp.*` weights)."""
    directory = Path(directory)
    config = build_qwen3_config(json.loads((directory / "config.json").read_text()))
    model = DemoModel(config)
    state = load_file(str(directory / "model.safetensors"))
    lm_state = {k: v.float() for k, v in state.items() if not k.startswith("mtp.")}
    if config.tie_word_embeddings:
        lm_state["lm_head.weight"] = lm_state["model.embed_tokens.weight"]
    model.lm.load_state_dict(lm_state, strict=True)
    model.mtp.load_state_dict({k[4:]: v.float() for k, v in state.items() if k.startswith("mtp.")}, strict=True)
    return model.to(device).eval()


def parameter_counts(model: DemoModel) -> dict[str, int]:
    """Unique parameter counts: base model (tied embedding once), MTP head, total."""
    base = sum(p.numel() for p in {id(p): p for p in model.lm.parameters()}.values())
    mtp = sum(p.numel() for p in model.mtp.parameters())
    embedding = model.lm.model.embed_tokens.weight.numel()
    return {"base": base, "base_non_embedding": base - embedding, "mtp": mtp, "total": base + mtp}


@torch.no_grad()
def check_causal(model: DemoModel, vocab: int, length: int = 24, seed: int = 0) -> None:
    """Raise if changing token j changes the base hidden states before j or MTP outputs before j-1.

    MTP entry t reads token t+1 and h_t, so a change at j may touch entries j-1 and later only.
    Run it on the CPU: a leak through attention moves outputs by far more than the tolerance.
    """
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, length), generator=gen).to(device)
    changed = ids.clone()
    j = length // 2
    changed[0, j] = (ids[0, j] + 1) % vocab
    outs = []
    for seq in (ids, changed):
        hidden = model.base(seq)
        outs.append((hidden, model.mtp_hidden(hidden[:, :-1], seq[:, 1:])))
    (h0, m0), (h1, m1) = outs

    def gap(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max()) if a.numel() else 0.0

    if gap(h0[:, :j], h1[:, :j]) > 1e-6 or gap(m0[:, :j - 1], m1[:, :j - 1]) > 1e-6:
        raise RuntimeError("attention is not causal: a later token changed earlier outputs")
    if gap(m0[:, j - 1:], m1[:, j - 1:]) <= 1e-6:
        raise RuntimeError("MTP output ignores its input token")
