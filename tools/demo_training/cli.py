"""One run, start to end: data, tokenizer, model, training, evaluation of the bf16 weights as
shipped, output directory, metrics.json and MODEL_CARD.md; and the command line."""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from tools.demo_training.acceptance import measure_acceptance, teacher_forced_agreement
from tools.demo_training.card import write_model_card
from tools.demo_training.corpus import collect_corpus, encode_stream, split_by_file, train_tokenizer
from tools.demo_training.export import check_against_transformers, round_to_shipped, write_json, write_model_dir
from tools.demo_training.model import DemoModel, build_qwen3_config, check_causal, model_config_dict, parameter_counts
from tools.demo_training.settings import MTP_LOSS_WEIGHT, SMOKE, Settings, log
from tools.demo_training.training import evaluate, train

DESCRIPTION = "Train 1bit's built-in demo model: a small Qwen3 code model with a multi-token-prediction head."


@dataclass
class Data:
    """The corpus, its split and tokens, and the tokenizer trained on it."""

    docs: list[tuple[str, str]]
    sources: list[dict]
    val_docs: list[tuple[str, str]]
    corpus_bytes: int
    val_bytes: int
    tok: Tokenizer
    tok_bytes: int
    vocab: int
    train_np: np.ndarray
    val_np: np.ndarray


def windows(tokens: torch.Tensor, span: int, limit: int) -> torch.Tensor:
    """Up to `limit` consecutive non-overlapping windows of `span` tokens."""
    count = min(limit, len(tokens) // span)
    return tokens[:count * span].view(count, span)


def settings_for(args: argparse.Namespace) -> Settings:
    """The full or smoke settings with the command line's overrides."""
    settings = SMOKE if args.smoke else Settings()
    if args.batch_size:
        settings = replace(settings, batch_size=args.batch_size)
    if args.max_steps:
        settings = replace(settings, max_steps=args.max_steps)
    if args.corpus_mb:
        settings = replace(settings, corpus_mb=args.corpus_mb)
    return settings


def prepare_data(settings: Settings, stages: dict) -> Data:
    """Collect and split the corpus, train the tokenizer on part of the training split, tokenize."""
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
    return Data(docs, sources, val_docs, corpus_bytes, val_bytes, tok, tok_bytes, vocab, train_np, val_np)


def final_evaluation(model: DemoModel, data: Data, val_tokens: torch.Tensor, val_windows: torch.Tensor,
                     settings: Settings, device: torch.device) -> dict:
    """Losses, bits per byte, MTP acceptance and top-1 agreement of the model as it stands."""
    final_base, final_mtp = evaluate(model, val_windows, settings.batch_size, device)
    bits_per_byte = final_base * (len(data.val_np) / max(1, data.val_bytes)) / math.log(2)
    log(f"final validation (bf16 weights): loss {final_base:.4f}, mtp loss {final_mtp:.4f}, "
        f"{bits_per_byte:.3f} bits/byte")
    acceptance = measure_acceptance(model, val_tokens, settings, device)
    agreement = teacher_forced_agreement(model, val_windows, settings.batch_size, device)
    log(f"held-out top-1 (true prefix): {agreement}")
    return {"final_val_loss": final_base, "final_val_mtp_loss": final_mtp, "bits_per_byte": bits_per_byte,
            "acceptance": acceptance, "agreement": agreement}


def build_metrics(args: argparse.Namespace, settings: Settings, device: torch.device, data: Data, counts: dict,
                  history: dict, result: dict, val_eval_tokens: int, out: Path) -> dict:
    """The contents of metrics.json (`result` from final_evaluation plus the logit check)."""
    return {
        "seed": args.seed,
        "smoke": bool(args.smoke),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": metadata.version("transformers"), "tokenizers": metadata.version("tokenizers")},
        "settings": asdict(settings),
        "vocab_size": data.vocab,
        "parameters": counts,
        "checkpoint_bytes": (out / "model.safetensors").stat().st_size,
        "mtp_loss_weight": MTP_LOSS_WEIGHT,
        "data": {
            "python": platform.python_version(),
            "files": len(data.docs), "bytes": data.corpus_bytes, "val_files": len(data.val_docs),
            "val_bytes": data.val_bytes, "train_tokens": int(len(data.train_np)), "val_tokens": int(len(data.val_np)),
            "tokenizer_train_bytes": data.tok_bytes, "val_eval_tokens": int(val_eval_tokens),
            "sources": data.sources,
        },
        "training": {k: history[k] for k in ("steps", "tokens_seen", "train_seconds", "batch_size", "step_mode",
                                             "scheduled_steps")}
        | {"precision": "bf16 autocast" if device.type == "cuda" else "float32"},
        "train_curve": history["train_curve"],
        "val_curve": history["val_curve"],
        "final_val_loss": round(result["final_val_loss"], 4),
        "final_val_mtp_loss": round(result["final_val_mtp_loss"], 4),
        "final_val_bits_per_byte": round(result["bits_per_byte"], 4),
        "mtp_acceptance": result["acceptance"],
        "mtp_acceptance_definition": (
            "Greedy speculative decoding from held-out prompts (float32, bf16-rounded weights). With tokens up to "
            "c known: draft 1 = argmax MTP(h_{c-1}, token c), draft j+1 = argmax MTP(previous MTP layer output, "
            "draft j); a verify step accepts the longest prefix of drafts equal to the base model's greedy "
            "tokens, then moves on by accepted + 1. acceptance_rate = accepted drafts / proposed drafts; "
            "per_depth_conditional[i] = P(draft i+1 accepted | drafts 1..i accepted)."),
        "teacher_forced": result["agreement"],
        "transformers_max_abs_logit_diff": result["logit_diff"],
    }


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """The whole pipeline; returns the metrics written to metrics.json."""
    t0 = time.time()
    settings = settings_for(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_float32_matmul_precision("high")  # TF32 for the float32 parts on the GPU
    stages = {}
    log(f"1bit demo model: device {device}, torch {torch.__version__}, seed {args.seed}, "
        f"{'smoke' if args.smoke else 'full'} settings")
    data = prepare_data(settings, stages)

    config_dict = model_config_dict(settings, data.vocab, data.tok)
    model = DemoModel(build_qwen3_config(config_dict))
    check_causal(model, data.vocab)
    model = model.to(device)
    counts = parameter_counts(model)
    log("parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    span = settings.seq_len + 1
    train_tokens = torch.from_numpy(data.train_np).to(device)
    val_tokens = torch.from_numpy(data.val_np).to(device)
    val_windows = windows(val_tokens, span, settings.val_windows).long()
    if len(val_windows) == 0 or len(train_tokens) <= span:
        raise SystemExit("corpus too small for one training or validation window")

    # The training budget is --minutes, but never past --deadline-minutes after start minus a
    # reserve for evaluation and writing the output.
    reserve_s = 45.0
    budget_s = min(args.minutes * 60, args.deadline_minutes * 60 - reserve_s - (time.time() - t0))
    log(f"training for {budget_s / 60:.2f} min" + (f" or {settings.max_steps} steps" if settings.max_steps else ""))
    compile_it = device.type == "cuda" and not args.no_compile
    history = train(model, train_tokens, val_windows, settings, device, args.seed, budget_s, compile_it)

    tick = time.time()
    state = model.export_state()
    round_to_shipped(model, state)  # evaluate exactly what is shipped: weights rounded to bf16
    result = final_evaluation(model, data, val_tokens, val_windows, settings, device)
    stages["final_eval_s"] = round(time.time() - tick, 1)
    for k in (1, 3):
        d = result["acceptance"].get(f"draft_{k}")
        if d:
            log(f"MTP acceptance, {k} draft(s): {d['acceptance_rate']:.1%} accepted, "
                f"{d['tokens_per_step']:.2f} tokens per step, per depth {d['per_depth_conditional']}")

    tick = time.time()
    write_model_dir(out, state, config_dict, data.tok, settings.max_position_embeddings)
    sample = val_windows[:2, :min(64, settings.seq_len)].cpu()
    model.to("cpu")
    check_causal(model, data.vocab)
    result["logit_diff"] = check_against_transformers(model, out, sample)
    stages["write_s"] = round(time.time() - tick, 1)
    log(f"transformers reproduces the logits to {result['logit_diff']:.2e}")

    stages["total_s"] = round(time.time() - t0, 1)
    val_eval_tokens = val_windows.numel() - len(val_windows)
    metrics = build_metrics(args, settings, device, data, counts, history, result, val_eval_tokens, out)
    metrics["stages_s"] = stages
    write_json(out / "metrics.json", metrics)
    write_model_card(out, metrics, settings, argv)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"wrote {out} ({size / 1e6:.1f} MB) in {stages['total_s']} s total: {stages}")
    return metrics


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=DESCRIPTION)
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
