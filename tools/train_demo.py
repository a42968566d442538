"""Train 1bit's built-in demo model: a small Qwen3 code model with a multi-token-prediction head.

    PYTHONPATH=. python3 tools/train_demo.py --out DIR [--minutes 6.5] [--seed 0] [--smoke]

One run does everything, offline: collect permissively licensed Python source installed on the
machine (the standard library first, then site-packages whose metadata says BSD/MIT/Apache/PSF
or similar), split it into train/validation by file, train a byte-level BPE tokenizer, train a
Qwen3ForCausalLM jointly with an MTP head (loss on token t+2, layout in tools/mtp_layout.md) for
a fixed wall-clock budget, measure greedy speculative-decoding acceptance of the head on held-out
prompts, and write a Hugging Face model directory (config, bf16 safetensors with `mtp.*` beside
the base weights, tokenizer files, generation config, metrics.json, MODEL_CARD.md).

`--smoke` is a tiny configuration (2 layers, hidden 64, vocab 512, a few hundred KB of stdlib
text, 20 steps) that finishes on a CPU in seconds; the tests run it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn
from transformers import Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from onebit.testing.tiny import tokenizer_config  # noqa: E402  (one ChatML setup for the project)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MTP_LOSS_WEIGHT = 0.3
VAL_FRACTION = 0.02
STDLIB = "python-stdlib"
STDLIB_LICENSE = "PSF-2.0"


# --------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class Settings:
    """Every knob of one run: model shape, data caps, optimisation and evaluation sizes."""

    vocab: int = 8192
    hidden: int = 384
    layers: int = 8
    heads: int = 6
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
    max_steps: int | None = None  # None: train until the time budget runs out
    corpus_mb: float = 128.0  # text tokenized for training and validation
    tokenizer_mb: float = 32.0  # the part of it the BPE merges are learned from
    packages: bool = True  # False: standard library only
    max_file_kb: int = 256
    val_windows: int = 192  # fixed held-out set, seq_len + 1 tokens each
    val_every_s: float = 30.0
    log_every_s: float = 10.0
    log_every_steps: int | None = None  # overrides log_every_s when set
    val_every_steps: int | None = None  # overrides val_every_s when set
    accept_prompts: int = 32
    accept_prompt_len: int = 128
    accept_new_tokens: int = 128


SMOKE = Settings(
    vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128,
    max_position_embeddings=512, seq_len=64, batch_size=8, lr=3e-3, warmup_steps=4,
    max_steps=20, corpus_mb=0.4, tokenizer_mb=0.4, packages=False, val_windows=8,
    log_every_steps=1, val_every_steps=5, accept_prompts=3, accept_prompt_len=24,
    accept_new_tokens=16,
)


def log(message: str) -> None:
    """Print one progress line immediately (the run's output is captured remotely)."""
    print(message, flush=True)


# --------------------------------------------------------------------------------------------
# Data: which Python files, under which licence


_PERMISSIVE_ID = re.compile(
    r"^(MIT(-0|-CMU)?|0BSD|BSD(-\d-Clause(-[A-Za-z]+)*)?|Apache(-2\.0)?|PSF(-2\.0)?|Python-2\.0(\.1)?"
    r"|ISC|Zlib|CC0-1\.0|BSL-1\.0|Unlicense|CNRI-Python|HPND)$", re.IGNORECASE)
_PERMISSIVE_WORDS = re.compile(r"\b(MIT|BSD|Apache|PSF|Python Software Foundation|ISC|zlib)\b", re.IGNORECASE)
_RESTRICTIVE_WORDS = re.compile(r"GPL|MPL|Mozilla|proprietary|commercial|Commons Clause", re.IGNORECASE)


def spdx_is_permissive(expression: str) -> bool:
    """Evaluate an SPDX licence expression: AND needs every side permissive, OR needs one.

    `WITH <exception>` clauses only add permissions, so they are skipped. Anything that does
    not parse counts as not permissive.
    """
    tokens = re.findall(r"[()]|[^\s()]+", expression)
    pos = 0

    def peek() -> str:
        return tokens[pos].upper() if pos < len(tokens) else ""

    def atom() -> bool:
        nonlocal pos
        token = tokens[pos]
        pos += 1
        if token == "(":
            value = either()
            if peek() != ")":
                raise ValueError("unbalanced parenthesis")
            pos += 1
        else:
            value = bool(_PERMISSIVE_ID.match(token))
        if peek() == "WITH":
            pos += 2
        return value

    def both() -> bool:
        nonlocal pos
        value = atom()
        while peek() == "AND":
            pos += 1
            value = atom() and value
        return value

    def either() -> bool:
        nonlocal pos
        value = both()
        while peek() == "OR":
            pos += 1
            value = both() or value
        return value

    try:
        value = either()
    except (IndexError, ValueError):
        return False
    return value and pos == len(tokens)


def distribution_license(dist: metadata.Distribution) -> tuple[str, bool]:
    """(licence as the metadata states it, whether it is permissive) for one installed package.

    Order of evidence: `License-Expression` (SPDX), then the `License ::` classifiers (all must
    be permissive), then a short free-text `License` field. Long free-text fields (a whole
    licence pasted in) are judged by their first line only.
    """
    meta = dist.metadata
    expression = (meta.get("License-Expression") or "").strip()
    if expression:
        return expression, spdx_is_permissive(expression)
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License ::")]
    classifiers = [c for c in classifiers if c != "OSI Approved"]
    if classifiers:
        ok = all(_PERMISSIVE_WORDS.search(c) and not _RESTRICTIVE_WORDS.search(c) for c in classifiers)
        return "; ".join(classifiers), ok
    text = (meta.get("License") or "").strip()
    first = text.splitlines()[0].strip() if text else ""
    if not first or first.upper() == "UNKNOWN":
        return "unknown", False
    ok = bool(_PERMISSIVE_WORDS.search(first)) and not _RESTRICTIVE_WORDS.search(text)
    return first[:80], ok


@dataclass
class SourceFile:
    """One candidate .py file: a stable label (package/relative path), where it is, its size."""

    label: str
    path: Path
    size: int
    source: str


def _stable_hash(label: str) -> int:
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")


def _stdlib_files() -> list[SourceFile]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        # Third-party packages live under the stdlib folder on some layouts; they are judged
        # by their own metadata instead.
        if {"site-packages", "dist-packages", "__pycache__"} & set(rel.parts) or not path.is_file():
            continue
        files.append(SourceFile(f"{STDLIB}/{rel.as_posix()}", path, path.stat().st_size, STDLIB))
    return files


def _package_files(packages: list[dict]) -> list[SourceFile]:
    """Files of installed distributions, from their RECORD; fills `packages` with one row each."""
    seen_names: set[str] = set()
    files = []
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if not name or key in seen_names or key == "onebit":
            continue
        seen_names.add(key)
        licence, ok = distribution_license(dist)
        row = {"package": name, "version": dist.version, "license": licence, "permissive": ok,
               "files_found": 0, "files_used": 0, "bytes_used": 0}
        packages.append(row)
        if not ok or dist.files is None:
            continue
        for entry in dist.files:
            if entry.suffix != ".py" or ".." in entry.parts or "__pycache__" in entry.parts:
                continue
            path = Path(dist.locate_file(entry))
            if not path.is_file():
                continue
            row["files_found"] += 1
            files.append(SourceFile(f"{name}/{entry.as_posix()}", path, path.stat().st_size, name))
    return files


def _read_source(path: Path, max_line: int = 1000) -> str | None:
    """The file as text, or None for non-UTF-8 files and data blobs with very long lines."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    text = text.replace("\r\n", "\n")
    if not text.strip() or max(map(len, text.split("\n"))) > max_line:
        return None
    return text


def collect_corpus(settings: Settings) -> tuple[list[tuple[str, str]], list[dict]]:
    """Choose and read the corpus: [(label, text)] in a deterministic order, and the source table.

    The standard library comes first, then permissively licensed packages; inside each, files
    are taken in the order of a hash of their label until `corpus_mb` of text is read, so a cap
    samples every package instead of the alphabetically first ones. Exact duplicates are dropped.
    """
    packages: list[dict] = [{"package": STDLIB, "version": platform.python_version(),
                             "license": STDLIB_LICENSE, "permissive": True,
                             "files_found": 0, "files_used": 0, "bytes_used": 0}]
    stdlib = _stdlib_files()
    packages[0]["files_found"] = len(stdlib)
    third = _package_files(packages) if settings.packages else []
    rows = {row["package"]: row for row in packages}
    max_bytes = settings.max_file_kb * 1024
    ordered = [f for group in (stdlib, third) for f in sorted(group, key=lambda f: (_stable_hash(f.label), f.label))
               if 64 <= f.size <= max_bytes]
    budget = int(settings.corpus_mb * 1e6)
    docs, seen, total = [], set(), 0
    for file in ordered:
        if total >= budget:
            break
        text = _read_source(file.path)
        if text is None:
            continue
        digest = hashlib.sha1(text.encode()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        docs.append((file.label, text))
        total += len(text.encode())
        rows[file.source]["files_used"] += 1
        rows[file.source]["bytes_used"] += len(text.encode())
    return docs, packages


def split_by_file(docs: list[tuple[str, str]], fraction: float = VAL_FRACTION):
    """(train, val) documents: a file is held out when the hash of its label falls under `fraction`."""
    cut = int(fraction * 2**64)
    val = [d for d in docs if _stable_hash("val:" + d[0]) < cut]
    if not val:  # a tiny corpus still needs a held-out file
        val = [min(docs, key=lambda d: _stable_hash("val:" + d[0]))]
    names = {label for label, _ in val}
    return [d for d in docs if d[0] not in names], val


# --------------------------------------------------------------------------------------------
# Tokenizer


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    """Byte-level BPE with the ChatML specials at ids 0-2; total vocab (specials included) `vocab`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Tokenizer, texts: list[str], chunk: int = 2048) -> np.ndarray:
    """All documents as one int32 token stream, each followed by `<|endoftext|>`."""
    eot = tok.token_to_id("<|endoftext|>")
    parts = []
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast skips offsets
    for start in range(0, len(texts), chunk):
        for enc in encode(texts[start:start + chunk], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.int32))
            parts.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


# --------------------------------------------------------------------------------------------
# Model


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


# --------------------------------------------------------------------------------------------
# Training


def lr_at(step: int, total: int, settings: Settings) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio * lr at step `total`."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = min(1.0, (step - settings.warmup_steps) / max(1, total - settings.warmup_steps))
    floor = settings.min_lr_ratio
    return settings.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: DemoModel, settings: Settings, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on norm weights)."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8, **extra)


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model: DemoModel, windows: torch.Tensor, batch: int, device: torch.device) -> tuple[float, float]:
    """Mean (base, MTP) validation loss per token over the fixed held-out windows."""
    was_training = model.training
    model.eval()
    base_sum = mtp_sum = 0.0
    for start in range(0, len(windows), batch):
        part = windows[start:start + batch]
        with _autocast(device):
            base, mtp = model.losses(part)
        base_sum += base.item() * len(part)
        mtp_sum += mtp.item() * len(part)
    model.train(was_training)
    return base_sum / len(windows), mtp_sum / len(windows)


class StepFunction:
    """The loss forward, compiled with torch.compile when asked; any compile failure falls back to eager."""

    def __init__(self, model: DemoModel, compile_it: bool):
        self.eager = model.losses
        self.compiled = None
        if compile_it:
            try:
                self.compiled = torch.compile(model.losses, dynamic=False)
            except Exception as exc:  # noqa: BLE001 - any failure means "run eager"
                log(f"torch.compile unavailable ({type(exc).__name__}: {exc}); running eager")

    @property
    def mode(self) -> str:
        """'compiled' or 'eager'."""
        return "compiled" if self.compiled is not None else "eager"

    def give_up_compile(self, exc: BaseException) -> None:
        """Switch to eager for the rest of the run."""
        log(f"torch.compile failed ({type(exc).__name__}: {str(exc)[:300]}); falling back to eager")
        self.compiled = None

    def __call__(self, window: torch.Tensor):
        return (self.compiled or self.eager)(window)


def train(model: DemoModel, train_tokens: torch.Tensor, val_windows: torch.Tensor, settings: Settings,
          device: torch.device, seed: int, budget_s: float, compile_it: bool) -> dict:
    """Train for `budget_s` seconds (or settings.max_steps); return the logged curves and counters."""
    optimizer = make_optimizer(model, settings, device)
    step_fn = StepFunction(model, compile_it)
    gen = torch.Generator(device=device).manual_seed(seed)
    span = settings.seq_len + 1
    offsets = torch.arange(span, device=device)
    batch = settings.batch_size
    total_steps = settings.max_steps or 10**9  # re-estimated from the measured step time
    train_curve, val_curve = [], []
    tokens_seen, step = 0, 0
    acc_base = torch.zeros((), device=device)
    acc_mtp = torch.zeros((), device=device)
    acc_n = 0
    start = time.time()
    last_log = last_val = start
    timing_from: tuple[int, float] | None = None
    model.train()

    def do_val(now: float) -> None:
        base, mtp = evaluate(model, val_windows, settings.batch_size, device)
        val_curve.append({"step": step, "tokens": tokens_seen, "seconds": round(now - start, 1),
                          "val_loss": round(base, 4), "val_mtp_loss": round(mtp, 4)})
        log(f"  val   step {step:6d} | {(now - start) / 60:5.2f} min | loss {base:.4f} | mtp loss {mtp:.4f}")

    do_val(start)
    while step < total_steps:
        now = time.time()
        if settings.max_steps is None and now - start >= budget_s:
            break
        lr = lr_at(step, total_steps, settings)
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_tokens) - span, (batch,), device=device, generator=gen)
        window = train_tokens[starts[:, None] + offsets].long()
        optimizer.zero_grad(set_to_none=True)
        try:
            with _autocast(device):
                base, mtp = step_fn(window)
            (base + MTP_LOSS_WEIGHT * mtp).backward()
        except torch.cuda.OutOfMemoryError:
            if batch <= 1:
                raise
            batch //= 2
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            log(f"out of memory: batch size now {batch}")
            continue
        except Exception as exc:  # noqa: BLE001 - a compiled graph that fails runs eager instead
            if step_fn.compiled is None:
                raise
            step_fn.give_up_compile(exc)
            optimizer.zero_grad(set_to_none=True)
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch * settings.seq_len
        acc_base += base.detach()
        acc_mtp += mtp.detach()
        acc_n += 1

        if settings.max_steps is None:
            # Steps 1-10 include compilation; time steps 10-40 and size the cosine schedule so it
            # ends with the budget (5% kept for validation passes).
            if step == 10:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                timing_from = (step, time.time())
            elif step == 40 and timing_from is not None:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                per_step = (time.time() - timing_from[1]) / (step - timing_from[0])
                left = budget_s - (time.time() - start)
                total_steps = step + max(1, int(0.95 * left / per_step))
                log(f"  {per_step * 1000:.1f} ms/step ({step_fn.mode}, batch {batch}): "
                    f"schedule set to {total_steps} steps")

        now = time.time()
        log_due = (step % settings.log_every_steps == 0) if settings.log_every_steps else now - last_log >= settings.log_every_s
        if log_due or step == 1:
            base_avg, mtp_avg = (acc_base / acc_n).item(), (acc_mtp / acc_n).item()
            elapsed = now - start
            train_curve.append({"step": step, "tokens": tokens_seen, "seconds": round(elapsed, 1),
                                "train_loss": round(base_avg, 4), "train_mtp_loss": round(mtp_avg, 4),
                                "lr": lr})
            log(f"  train step {step:6d} | {elapsed / 60:5.2f} min | loss {base_avg:.4f} | mtp loss {mtp_avg:.4f}"
                f" | lr {lr:.2e} | {tokens_seen / 1e6:7.1f}M tokens | {tokens_seen / max(elapsed, 1e-9) / 1e3:6.0f}k tok/s")
            acc_base.zero_()
            acc_mtp.zero_()
            acc_n = 0
            last_log = now
        val_due = (step % settings.val_every_steps == 0) if settings.val_every_steps else now - last_val >= settings.val_every_s
        if val_due:
            do_val(now)
            last_val = time.time()

    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"train_curve": train_curve, "val_curve": val_curve, "steps": step, "tokens_seen": tokens_seen,
            "train_seconds": round(time.time() - start, 1), "batch_size": batch, "step_mode": step_fn.mode,
            "scheduled_steps": total_steps}


# --------------------------------------------------------------------------------------------
# MTP acceptance


@torch.no_grad()
def greedy_continue(model: DemoModel, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation of every prompt by the base model (full forward each step, float32)."""
    seq = prompts
    for _ in range(new_tokens):
        hidden = model.base(seq)
        nxt = model.logits(hidden[:, -1]).argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


@torch.no_grad()
def speculative_acceptance(model: DemoModel, seq: torch.Tensor, prompt_len: int, drafts: int) -> dict:
    """Simulate greedy speculative decoding of `seq` (a prompt + its greedy continuation) with the MTP head.

    With tokens up to c known and base hidden states up to c-1: draft 1 = argmax MTP(h_{c-1},
    token c); draft j+1 = argmax MTP(previous MTP output, draft j) at the next position. The
    base model's greedy tokens are `seq` itself, so a verify step accepts the longest matching
    prefix of the drafts, and decoding moves on by (accepted + 1) tokens.
    """
    hidden = model.base(seq[None])
    known = prompt_len
    steps = accepted = 0
    depth_tries = [0] * drafts
    depth_hits = [0] * drafts
    while known + drafts < len(seq):
        h = hidden[:, :known]
        toks = seq[1:known + 1][None]
        proposal = []
        for _ in range(drafts):
            out = model.mtp_hidden(h, toks)
            token = model.mtp_logits(out[:, -1]).argmax(-1)
            proposal.append(int(token))
            h = torch.cat([h, out[:, -1:]], dim=1)
            toks = torch.cat([toks, token[:, None]], dim=1)
        truth = seq[known + 1:known + 1 + drafts].tolist()
        ok = 0
        while ok < drafts and proposal[ok] == truth[ok]:
            ok += 1
        for depth in range(min(ok + 1, drafts)):
            depth_tries[depth] += 1
            depth_hits[depth] += depth < ok
        steps += 1
        accepted += ok
        known += ok + 1
    return {"steps": steps, "accepted": accepted, "depth_tries": depth_tries, "depth_hits": depth_hits}


@torch.no_grad()
def teacher_forced_agreement(model: DemoModel, windows: torch.Tensor, batch: int, device: torch.device) -> dict:
    """Top-1 figures on held-out text with the true prefix: base accuracy (token t+1), MTP accuracy
    (token t+2), and how often the MTP argmax equals the base model's argmax for token t+2."""
    model.eval()
    base_hits = mtp_hits = agree = base_total = mtp_total = 0
    for start in range(0, len(windows), batch):
        part = windows[start:start + batch]
        ids = part[:, :-1]
        with _autocast(device):
            hidden = model.base(ids)
            base_pred = model.logits(hidden).argmax(-1)
            mtp_pred = model.mtp_logits(model.mtp_hidden(hidden[:, :-1], ids[:, 1:])).argmax(-1)
        base_hits += int((base_pred == part[:, 1:]).sum())
        mtp_hits += int((mtp_pred == part[:, 2:]).sum())
        agree += int((mtp_pred == base_pred[:, 1:]).sum())
        base_total += base_pred.numel()
        mtp_total += mtp_pred.numel()
    return {"base_top1_accuracy": round(base_hits / base_total, 4),
            "mtp_top1_accuracy": round(mtp_hits / mtp_total, 4),
            "mtp_agrees_with_base": round(agree / mtp_total, 4)}


def measure_acceptance(model: DemoModel, val_tokens: torch.Tensor, settings: Settings, device: torch.device) -> dict:
    """Acceptance at draft lengths 1 and 3 on greedy continuations of held-out prompts."""
    model.eval()
    p, n = settings.accept_prompt_len, settings.accept_prompts
    room = len(val_tokens) - p
    if room <= 0:
        return {}
    starts = [int(i * room / n) for i in range(n)]
    prompts = torch.stack([val_tokens[s:s + p] for s in starts]).long().to(device)
    seqs = greedy_continue(model, prompts, settings.accept_new_tokens)
    result = {"prompts": n, "prompt_tokens": p, "new_tokens": settings.accept_new_tokens}
    for k in (1, 3):
        total = {"steps": 0, "accepted": 0, "depth_tries": [0] * k, "depth_hits": [0] * k}
        for seq in seqs:
            part = speculative_acceptance(model, seq, p, k)
            total["steps"] += part["steps"]
            total["accepted"] += part["accepted"]
            total["depth_tries"] = [a + b for a, b in zip(total["depth_tries"], part["depth_tries"])]
            total["depth_hits"] = [a + b for a, b in zip(total["depth_hits"], part["depth_hits"])]
        steps = max(1, total["steps"])
        result[f"draft_{k}"] = {
            "acceptance_rate": round(total["accepted"] / (k * steps), 4),
            "mean_accepted_per_step": round(total["accepted"] / steps, 4),
            "tokens_per_step": round(1 + total["accepted"] / steps, 4),
            "per_depth_conditional": [round(h / max(1, t), 4) for h, t in zip(total["depth_hits"], total["depth_tries"])],
            "verify_steps": total["steps"],
        }
    return result


# --------------------------------------------------------------------------------------------
# Output files


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_against_transformers(model: DemoModel, out: Path, sample: torch.Tensor) -> float:
    """Max |logit difference| between transformers' loader on `out` and our forward (float32, CPU)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the mtp.* keys are reported as unexpected, as intended
    reference = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ours = load_demo(out)
    with torch.no_grad():
        ref_logits = reference(sample).logits
        our_logits = ours.logits(ours.base(sample))
    return float((ref_logits - our_logits).abs().max())


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def write_model_card(out: Path, metrics: dict, settings: Settings, argv: list[str]) -> None:
    """MODEL_CARD.md: data and licences, size, losses, acceptance, how to reproduce."""
    m = metrics
    params = m["parameters"]
    used = [row for row in m["data"]["sources"] if row["files_used"]]
    skipped = [row for row in m["data"]["sources"] if not row["permissive"]]
    acc = m.get("mtp_acceptance", {})
    lines = [
        "# 1bit demo code model", "",
        "A small Qwen3-architecture model trained from scratch on permissively licensed Python source, "
        "with a jointly trained multi-token-prediction (MTP) head. It is 1bit's built-in default: it writes "
        "plausible Python, and its head gives honest speculative-decoding figures. It is a demo, not an "
        "assistant: it was trained on code only, without chat data, so use it through /v1/completions; "
        "the ChatML template is provided for API completeness.", "",
        "## Model", "",
        f"- Architecture: Qwen3ForCausalLM, {settings.layers} layers, hidden {settings.hidden}, "
        f"{settings.heads} query heads / {settings.kv_heads} KV heads of dim {settings.head_dim}, MLP {settings.intermediate}, "
        f"tied embeddings, RoPE theta {settings.rope_theta:g}, trained on {settings.seq_len}-token sequences "
        f"(max_position_embeddings {settings.max_position_embeddings}).",
        f"- Parameters: {_fmt_int(params['base'])} base ({_fmt_int(params['base_non_embedding'])} without the embedding) "
        f"+ {_fmt_int(params['mtp'])} MTP head = {_fmt_int(params['total'])}; stored in bfloat16 "
        f"({m['checkpoint_bytes'] / 1e6:.1f} MB).",
        f"- Tokenizer: byte-level BPE, {m['vocab_size']} tokens including `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`; "
        f"trained by the same script on {m['data']['tokenizer_train_bytes'] / 1e6:.1f} MB of the training split.",
        "- MTP head: `mtp.*` tensors in the same safetensors file (layout: `tools/mtp_layout.md` in the 1bit "
        "repository): RMSNorms on the token-(t+1) embedding and on the last layer's pre-norm hidden state h_t, "
        "a 2H->H projection of their concatenation, one Qwen3 decoder layer, a final RMSNorm, and the shared "
        f"LM head, predicting token t+2. Loss = base loss + {MTP_LOSS_WEIGHT} x MTP loss.", "",
        "## Data", "",
        f"Python source files installed on the training machine (Python {m['data']['python']}): the standard "
        "library first, then packages whose metadata declares a permissive licence, files taken in the order "
        "of a hash of their path up to the corpus cap; exact duplicates, non-UTF-8 files and files with lines "
        f"over 1000 characters dropped. {VAL_FRACTION:.0%} of files (chosen by a hash of the path) are held out "
        f"for validation. Corpus: {m['data']['files']} files, {m['data']['bytes'] / 1e6:.1f} MB; "
        f"{_fmt_int(m['data']['train_tokens'])} training tokens, {_fmt_int(m['data']['val_tokens'])} held-out tokens "
        f"({m['data']['val_files']} files).", "",
        "| source | version | licence (from its metadata) | files used | MB used |",
        "|---|---|---|---|---|",
    ]
    for row in used:
        lines.append(f"| {row['package']} | {row['version']} | {row['license']} | {row['files_used']} | "
                     f"{row['bytes_used'] / 1e6:.2f} |")
    if skipped:
        lines += ["", "Installed but not used (licence not permissive or not stated): "
                  + ", ".join(f"{r['package']} ({r['license']})" for r in skipped) + "."]
    lines += [
        "", "Permissive here means the SPDX identifiers MIT (also MIT-0, MIT-CMU), BSD-* and 0BSD, Apache-2.0, "
        "PSF-2.0/Python-2.0, ISC, Zlib, CC0-1.0, BSL-1.0, Unlicense, CNRI-Python and HPND (an AND expression needs "
        "all its parts permissive, an OR expression one); without an expression, every `License ::` classifier "
        "must name BSD, MIT, Apache, PSF, ISC or zlib; failing both, the first line of the free-text licence "
        "field is read.", "",
        "## Training", "",
        f"- {m['training']['steps']} AdamW steps (betas 0.9/0.95, weight decay {settings.weight_decay}, peak lr "
        f"{settings.lr}, {settings.warmup_steps} warm-up steps, cosine to {settings.min_lr_ratio:g}x, gradient clip "
        f"{settings.grad_clip}), batch {m['training']['batch_size']} x {settings.seq_len} tokens, "
        f"{m['training']['tokens_seen'] / 1e6:.1f}M tokens seen in {m['training']['train_seconds']:.0f} s on "
        f"{m['device']} ({m['training']['step_mode']}, {m['training']['precision']}), seed {m['seed']}.",
        f"- Final validation loss per token: **{m['final_val_loss']:.4f}** (MTP, token t+2: "
        f"{m['final_val_mtp_loss']:.4f}); {m['final_val_bits_per_byte']:.3f} bits per byte of held-out source, "
        "measured with the bf16 weights as shipped.",
        f"- transformers' `AutoModelForCausalLM` on this directory reproduces the training model's logits to "
        f"{m['transformers_max_abs_logit_diff']:.2e} (float32).", "",
        "## MTP acceptance", "",
        f"Greedy speculative decoding from {acc.get('prompts', 0)} held-out prompts of {acc.get('prompt_tokens', 0)} "
        f"tokens, {acc.get('new_tokens', 0)} new tokens each (float32). Draft j+1 feeds the MTP layer's own "
        "output back in as the hidden state; a verify step keeps the longest prefix of drafts equal to the base "
        "model's greedy tokens. Acceptance rate = accepted drafts / proposed drafts.", "",
        "| drafts per step | acceptance rate | accepted per step | tokens per step | conditional per depth |",
        "|---|---|---|---|---|",
    ]
    for k in (1, 3):
        d = acc.get(f"draft_{k}")
        if d:
            lines.append(f"| {k} | {d['acceptance_rate']:.1%} | {d['mean_accepted_per_step']:.2f} | "
                         f"{d['tokens_per_step']:.2f} | {', '.join(f'{x:.1%}' for x in d['per_depth_conditional'])} |")
    tf = m["teacher_forced"]
    lines += [
        "", f"On held-out text with the true prefix ({m['data']['val_eval_tokens']:,} tokens): base top-1 accuracy "
        f"{tf['base_top1_accuracy']:.1%} for token t+1, MTP top-1 accuracy {tf['mtp_top1_accuracy']:.1%} for token "
        f"t+2, and the MTP argmax equals the base model's argmax for t+2 at {tf['mtp_agrees_with_base']:.1%} of "
        "positions; unlike the acceptance above, this does not depend on the model's own continuations.",
    ]
    lines += [
        "", "## Licence", "",
        "The weights are released under Apache-2.0, like 1bit; the training data's licences are listed above.", "",
        "## Reproduce", "",
        "```", "PYTHONPATH=. python3 " + " ".join(["tools/train_demo.py"] + argv), "```", "",
        "The corpus depends on the Python installation (versions above); the seed fixes initialisation, "
        "batches and the split, while the number of steps follows the wall-clock budget.", "",
    ]
    (out / "MODEL_CARD.md").write_text("\n".join(lines), encoding="utf-8")


# --------------------------------------------------------------------------------------------
# Main


def _windows(tokens: torch.Tensor, span: int, limit: int) -> torch.Tensor:
    """Up to `limit` consecutive non-overlapping windows of `span` tokens."""
    count = min(limit, len(tokens) // span)
    return tokens[:count * span].view(count, span)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """The whole pipeline; returns the metrics written to metrics.json."""
    t0 = time.time()
    settings = SMOKE if args.smoke else Settings()
    if args.batch_size:
        settings = replace(settings, batch_size=args.batch_size)
    if args.max_steps:
        settings = replace(settings, max_steps=args.max_steps)
    if args.corpus_mb:
        settings = replace(settings, corpus_mb=args.corpus_mb)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_float32_matmul_precision("high")  # TF32 for the float32 parts on the GPU
    stages = {}
    log(f"1bit demo model: device {device}, torch {torch.__version__}, seed {args.seed}, "
        f"{'smoke' if args.smoke else 'full'} settings")

    # Data
    tick = time.time()
    docs, sources = collect_corpus(settings)
    train_docs, val_docs = split_by_file(docs)
    corpus_bytes = sum(len(t.encode()) for _, t in docs)
    stages["collect_s"] = round(time.time() - tick, 1)
    log(f"corpus: {len(docs)} files, {corpus_bytes / 1e6:.1f} MB ({len(val_docs)} held out) "
        f"in {stages['collect_s']} s; sources: "
        + ", ".join(f"{r['package']} {r['bytes_used'] / 1e6:.1f} MB" for r in sources if r["files_used"]))

    tick = time.time()
    # Every k-th training file, so the merges see all sources, not just the first ones read.
    train_bytes = sum(len(t.encode()) for _, t in train_docs)
    stride = max(1, round(train_bytes / (settings.tokenizer_mb * 1e6)))
    tok_texts = [text for _, text in train_docs[::stride]]
    tok_bytes = sum(len(t.encode()) for t in tok_texts)
    tok = train_tokenizer(tok_texts, settings.vocab)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    stages["tokenizer_s"] = round(time.time() - tick, 1)
    tick = time.time()
    train_np = encode_stream(tok, [t for _, t in train_docs])
    val_np = encode_stream(tok, [t for _, t in val_docs])
    stages["tokenize_s"] = round(time.time() - tick, 1)
    # torch.compile forks workers; the tokenizer's thread pool is done, so say so (no fork warning).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    val_bytes = sum(len(t.encode()) for _, t in val_docs)
    log(f"tokenizer: {vocab} tokens, trained on {tok_bytes / 1e6:.1f} MB in {stages['tokenizer_s']} s; "
        f"{len(train_np):,} train / {len(val_np):,} val tokens in {stages['tokenize_s']} s "
        f"({corpus_bytes / max(1, len(train_np) + len(val_np)):.2f} bytes/token)")

    # Model
    config_dict = model_config_dict(settings, vocab, tok)
    model = DemoModel(build_qwen3_config(config_dict))
    check_causal(model, vocab)
    model = model.to(device)
    counts = parameter_counts(model)
    log("parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))

    span = settings.seq_len + 1
    train_tokens = torch.from_numpy(train_np).to(device)
    val_tokens = torch.from_numpy(val_np).to(device)
    val_windows = _windows(val_tokens, span, settings.val_windows).long()
    if len(val_windows) == 0 or len(train_tokens) <= span:
        raise SystemExit("corpus too small for one training or validation window")

    # The training budget is --minutes, but never past --deadline-minutes after start minus a
    # reserve for evaluation and writing the output.
    reserve_s = 45.0
    budget_s = min(args.minutes * 60, args.deadline_minutes * 60 - reserve_s - (time.time() - t0))
    log(f"training for {budget_s / 60:.2f} min" + (f" or {settings.max_steps} steps" if settings.max_steps else ""))
    compile_it = device.type == "cuda" and not args.no_compile
    history = train(model, train_tokens, val_windows, settings, device, args.seed, budget_s, compile_it)

    # Evaluate exactly what is shipped: weights rounded to bf16.
    tick = time.time()
    state = model.export_state()
    with torch.no_grad():
        for name, param in list(model.lm.named_parameters()) + [("mtp." + n, p) for n, p in model.mtp.named_parameters()]:
            if name in state:
                param.copy_(state[name].float())
    final_base, final_mtp = evaluate(model, val_windows, settings.batch_size, device)
    val_eval_tokens = val_windows.numel() - len(val_windows)
    bits_per_byte = final_base * (len(val_np) / max(1, val_bytes)) / math.log(2)
    log(f"final validation (bf16 weights): loss {final_base:.4f}, mtp loss {final_mtp:.4f}, "
        f"{bits_per_byte:.3f} bits/byte")
    acceptance = measure_acceptance(model, val_tokens, settings, device)
    agreement = teacher_forced_agreement(model, val_windows, settings.batch_size, device)
    log(f"held-out top-1 (true prefix): {agreement}")
    stages["final_eval_s"] = round(time.time() - tick, 1)
    for k in (1, 3):
        d = acceptance.get(f"draft_{k}")
        if d:
            log(f"MTP acceptance, {k} draft(s): {d['acceptance_rate']:.1%} accepted, "
                f"{d['tokens_per_step']:.2f} tokens per step, per depth {d['per_depth_conditional']}")

    # Output
    tick = time.time()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    _write_json(out / "config.json", config_dict)
    tok.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(tok, settings.max_position_embeddings))
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    _write_json(out / "generation_config.json", {
        "bos_token_id": endoftext, "eos_token_id": [endoftext, im_end], "pad_token_id": endoftext,
        "do_sample": False,
    })
    sample = val_windows[:2, :min(64, settings.seq_len)].cpu()
    model.to("cpu")
    check_causal(model, vocab)
    logit_diff = check_against_transformers(model, out, sample)
    stages["write_s"] = round(time.time() - tick, 1)
    log(f"transformers reproduces the logits to {logit_diff:.2e}")

    stages["total_s"] = round(time.time() - t0, 1)
    metrics = {
        "seed": args.seed,
        "smoke": bool(args.smoke),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": metadata.version("transformers"), "tokenizers": metadata.version("tokenizers")},
        "settings": asdict(settings),
        "vocab_size": vocab,
        "parameters": counts,
        "checkpoint_bytes": (out / "model.safetensors").stat().st_size,
        "mtp_loss_weight": MTP_LOSS_WEIGHT,
        "data": {
            "python": platform.python_version(),
            "files": len(docs), "bytes": corpus_bytes, "val_files": len(val_docs), "val_bytes": val_bytes,
            "train_tokens": int(len(train_np)), "val_tokens": int(len(val_np)),
            "tokenizer_train_bytes": tok_bytes, "val_eval_tokens": int(val_eval_tokens),
            "sources": sources,
        },
        "training": {k: history[k] for k in ("steps", "tokens_seen", "train_seconds", "batch_size", "step_mode",
                                             "scheduled_steps")}
        | {"precision": "bf16 autocast" if device.type == "cuda" else "float32"},
        "train_curve": history["train_curve"],
        "val_curve": history["val_curve"],
        "final_val_loss": round(final_base, 4),
        "final_val_mtp_loss": round(final_mtp, 4),
        "final_val_bits_per_byte": round(bits_per_byte, 4),
        "mtp_acceptance": acceptance,
        "mtp_acceptance_definition": (
            "Greedy speculative decoding from held-out prompts (float32, bf16-rounded weights). With tokens up to "
            "c known: draft 1 = argmax MTP(h_{c-1}, token c), draft j+1 = argmax MTP(previous MTP layer output, "
            "draft j); a verify step accepts the longest prefix of drafts equal to the base model's greedy "
            "tokens, then moves on by accepted + 1. acceptance_rate = accepted drafts / proposed drafts; "
            "per_depth_conditional[i] = P(draft i+1 accepted | drafts 1..i accepted)."),
        "teacher_forced": agreement,
        "transformers_max_abs_logit_diff": logit_diff,
        "stages_s": stages,
    }
    _write_json(out / "metrics.json", metrics)
    write_model_card(out, metrics, settings, argv)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"wrote {out} ({size / 1e6:.1f} MB) in {stages['total_s']} s total: {stages}")
    return metrics


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output model directory")
    parser.add_argument("--minutes", type=float, default=6.5, help="training wall-clock budget")
    parser.add_argument("--deadline-minutes", type=float, default=8.6,
                        help="the whole run must end by then; training is cut short to fit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny CPU configuration for tests")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--corpus-mb", type=float, default=None, help="cap on the text read")
    parser.add_argument("--no-compile", action="store_true", help="never use torch.compile")
    args = parser.parse_args(argv)
    run(args, argv)


if __name__ == "__main__":
    main()
