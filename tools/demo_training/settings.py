"""Every knob of a demo-model run (the full and the smoke configuration) and the shared constants."""

from __future__ import annotations

from dataclasses import dataclass

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MTP_LOSS_WEIGHT = 0.3
VAL_FRACTION = 0.02
STDLIB = "python-stdlib"
STDLIB_LICENSE = "PSF-2.0"


@dataclass(frozen=True)
class Settings:
    """Every knob of one run: model shape, data caps, optimisation and evaluation sizes."""

    vocab: int = 8192
    hidden: int = 448
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1024
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    seq_len: int = 512
    batch_size: int = 128
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 150
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    max_steps: int | None = None  # None: train until the time budget or max_epochs runs out
    max_epochs: float = 2.0  # passes over the training tokens (code and chat pairs)
    chat_fraction: float = 0.04  # chat pairs' share of the training bytes (at most)
    corpus_mb: float = 2000.0  # cap on the text kept for training and validation
    tokenizer_mb: float = 32.0  # the part of it the BPE merges are learned from
    packages: bool = True  # False: standard library only
    max_file_kb: int = 256
    val_windows: int = 192  # fixed held-out set, seq_len + 1 tokens each
    val_every_s: float = 15.0
    checkpoint_every_s: float = 60.0  # the best-so-far model is written out at most this often
    log_every_s: float = 10.0
    log_every_steps: int | None = None  # overrides log_every_s when set
    val_every_steps: int | None = None  # overrides val_every_s when set
    accept_prompts: int = 32
    accept_prompt_len: int = 128
    accept_new_tokens: int = 128
    eval_new_tokens: int = 64  # greedy tokens per plain code prompt in the final check
    chat_new_tokens: int = 160  # most greedy tokens of the chat answer in the final check


SMOKE = Settings(
    vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
    max_position_embeddings=512, seq_len=64, batch_size=8, lr=3e-3, warmup_steps=4,
    max_steps=20, corpus_mb=0.4, tokenizer_mb=0.4, packages=False, val_windows=8,
    log_every_steps=1, val_every_steps=5, accept_prompts=3, accept_prompt_len=24,
    accept_new_tokens=16, eval_new_tokens=16, chat_new_tokens=24, checkpoint_every_s=0.0,
)


def log(message: str) -> None:
    """Print one progress line immediately (the run's output is captured remotely)."""
    print(message, flush=True)
