"""One run, start to end: data, tokenizer, model, training, evaluation of the bf16 weights as
shipped, output directory, metrics.json and MODEL_CARD.md; and the command line."""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from tools.demo_training.acceptance import measure_acceptance, teacher_forced_agreement
from tools.demo_training.card import write_model_card
from tools.demo_training.checks import generation_checks
from tools.demo_training.corpus import collect_corpus, encode_docs, join_stream, split_by_file, train_tokenizer
from tools.demo_training.evaluation import __doc__ as PARSE_RULE
from tools.demo_training.evaluation import table
from tools.demo_training.instructions import select_pairs
from tools.demo_training.export import check_against_transformers, round_to_shipped, write_json, write_model_dir
from tools.demo_training.model import DemoModel, build_qwen3_config, check_causal, model_config_dict, parameter_counts
from tools.demo_training.package import package
from tools.demo_training.settings import MTP_LOSS_WEIGHT, SMOKE, Settings, log
from tools.demo_training.training import evaluate, train

DESCRIPTION = "Train 1bit's built-in demo model: a small Qwen3 code model with a multi-token-prediction head."


@dataclass
class Data:
    """The corpus, its split and tokens, the chat pairs mixed in, and the tokenizer trained on it."""

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
    dedup: dict = field(default_factory=dict)
    chat: dict = field(default_factory=dict)


def windows(tokens: torch.Tensor, span: int, limit: int) -> torch.Tensor:
    """Up to `limit` non-overlapping windows of `span` tokens, spread evenly over `tokens` (the
    held-out files come in corpus order, standard library first: every part gets its share)."""
    count = len(tokens) // span
    every = tokens[:count * span].view(count, span)
    if count <= limit:
        return every
    return every[torch.linspace(0, count - 1, limit).round().long().to(tokens.device)]


def settings_for(args: argparse.Namespace) -> Settings:
    """The full or smoke settings with the command line's overrides."""
    settings = SMOKE if args.smoke else Settings()
    if args.batch_size:
        settings = replace(settings, batch_size=args.batch_size)
    if args.max_steps:
        settings = replace(settings, max_steps=args.max_steps)
    if args.corpus_mb:
        settings = replace(settings, corpus_mb=args.corpus_mb)
    if args.max_epochs:
        settings = replace(settings, max_epochs=args.max_epochs)
    return settings


def prepare_data(settings: Settings, stages: dict, seed: int) -> Data:
    """Collect (in parallel, deduplicated) and split the corpus, train the tokenizer on part of the
    training split, tokenize it and the chat pairs, and mix them into one training stream."""
    tick = time.time()
    corpus = collect_corpus(settings)
    docs, sources = corpus.docs, corpus.sources
    train_docs, val_docs = split_by_file(docs)
    corpus_bytes = sum(len(t.encode()) for _, t in docs)
    stages["collect_s"] = round(time.time() - tick, 1)
    log(f"corpus: {len(docs)} files, {corpus_bytes / 1e6:.1f} MB ({len(val_docs)} held out) "
        f"in {stages['collect_s']} s; dropped {corpus.dedup}; {len(corpus.pairs)} chat pairs found; sources: "
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
    val_names = {label for label, _ in val_docs}
    pairs = select_pairs([p for p in corpus.pairs if p[0] not in val_names],
                         int(settings.chat_fraction * train_bytes))
    code_parts = encode_docs(tok, [t for _, t in train_docs], specials=False)
    chat_parts = encode_docs(tok, pairs, specials=True)
    parts = code_parts + chat_parts
    order = np.random.default_rng(seed).permutation(len(parts))
    eot = tok.token_to_id("<|endoftext|>")
    train_np = join_stream([parts[i] for i in order], eot)
    val_np = join_stream(encode_docs(tok, [t for _, t in val_docs], specials=False), eot)
    stages["tokenize_s"] = round(time.time() - tick, 1)
    chat_tokens = sum(len(p) + 1 for p in chat_parts)
    chat = {"pairs": len(pairs), "pairs_found": len(corpus.pairs), "tokens": int(chat_tokens),
            "bytes": sum(len(p.encode()) for p in pairs),
            "token_fraction": round(chat_tokens / max(1, len(train_np)), 4),
            "loss": "all tokens of the rendered pair (the user turn too), like code",
            "example": pairs[0] if pairs else None}
    # torch.compile forks workers; the tokenizer's thread pool is done, so say so (no fork warning).
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    val_bytes = sum(len(t.encode()) for _, t in val_docs)
    log(f"tokenizer: {vocab} tokens, trained on {tok_bytes / 1e6:.1f} MB in {stages['tokenizer_s']} s; "
        f"{len(train_np):,} train tokens ({chat_tokens:,} of them in {len(pairs)} chat pairs, "
        f"{chat['token_fraction']:.1%}) / {len(val_np):,} val tokens in {stages['tokenize_s']} s "
        f"({corpus_bytes / max(1, len(train_np) + len(val_np) - chat_tokens):.2f} bytes/token)")
    return Data(docs, sources, val_docs, corpus_bytes, val_bytes, tok, tok_bytes, vocab, train_np, val_np,
                corpus.dedup, chat)


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
            "dropped": data.dedup, "chat_pairs": data.chat,
            "sources": data.sources,
        },
        "training": {k: history[k] for k in ("steps", "tokens_seen", "train_seconds", "batch_size", "step_mode",
                                             "scheduled_steps", "epochs", "tokens_per_epoch")}
        | {"precision": "bf16 autocast" if device.type == "cuda" else "float32"},
        "best_checkpoint": history["best"],
        "best_checkpoint_rule": f"lowest validation base loss + {MTP_LOSS_WEIGHT} x MTP loss over the evaluations "
                                "during training (and one at the end); the shipped weights are that state's",
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
        "generation_checks": result.get("generation"),
        "generation_check_rule": PARSE_RULE,
        "transformers_max_abs_logit_diff": result["logit_diff"],
    }


class CheckpointWriter:
    """Writes the model directory (and, with --package-to, the device package) for the best state
    so far during training, at most every `every_s` seconds, so a run cut short still leaves one."""

    def __init__(self, out: Path, package_to: Path | None, config_dict: dict, tok: Tokenizer, settings: Settings):
        self.out, self.package_to, self.config_dict, self.tok = out, package_to, config_dict, tok
        self.settings = settings
        self.last = -math.inf

    def write(self, model: DemoModel, note: dict) -> None:
        """Export `model` as it stands (bf16) with a metrics.json holding just `note`; package it."""
        write_model_dir(self.out, model.export_state(), self.config_dict, self.tok,
                        self.settings.max_position_embeddings)
        write_json(self.out / "metrics.json", note)
        if self.package_to is not None:
            package(self.out, self.package_to)

    def on_best(self, model: DemoModel, record: dict) -> None:
        """Training's callback after a new best validation objective."""
        if time.time() - self.last < self.settings.checkpoint_every_s:
            return
        tick = time.time()
        self.write(model, {"partial": True, "best_so_far": record})
        self.last = time.time()
        log(f"  wrote the best-so-far model (step {record['step']}) in {self.last - tick:.1f} s")


def summary_table(metrics: dict) -> str:
    """The short table the device run prints last."""
    m, t = metrics, metrics["training"]
    gen = m.get("generation_checks") or {}
    rows = [("stages (s)", ", ".join(f"{k[:-2]} {v}" for k, v in m["stages_s"].items())),
            ("corpus", f"{m['data']['files']} files, {m['data']['bytes'] / 1e6:.1f} MB, dropped {m['data']['dropped']}"),
            ("tokens", f"{m['data']['train_tokens']:,} train ({m['data']['chat_pairs']['pairs']} chat pairs, "
                       f"{m['data']['chat_pairs']['token_fraction']:.1%}), {m['data']['val_tokens']:,} val"),
            ("model", f"{m['parameters']['total']:,} parameters, {m['checkpoint_bytes'] / 1e6:.1f} MB bf16"),
            ("training", f"{t['steps']} steps, {t['epochs']} epochs, {t['tokens_seen'] / 1e6:.0f}M tokens in "
                         f"{t['train_seconds']} s ({t['step_mode']})"),
            ("best checkpoint", f"step {m['best_checkpoint'].get('step')}: val loss "
                                f"{m['best_checkpoint'].get('val_loss')}, mtp {m['best_checkpoint'].get('val_mtp_loss')}"),
            ("shipped (bf16) val", f"loss {m['final_val_loss']}, mtp {m['final_val_mtp_loss']}, "
                                   f"{m['final_val_bits_per_byte']} bits/byte")]
    if gen:
        code = gen["code_prompts"]
        rows += [("code prompts parse", f"{gen['code_parsed']}/{gen['code_total']} (whole "
                  f"{sum(c['parses_whole'] for c in code)}, to a top-level statement "
                  f"{sum(c['parses_to_top_level'] for c in code)}): "
                  + " ".join("Y" if c["parses"] else "n" for c in code)),
                 ("chat: def parses", f"{'yes' if gen['chat']['has_parsing_def'] else 'NO'} "
                                      f"({'ended itself' if gen['chat']['finished'] else 'hit the token limit'})")]
    else:
        rows.append(("generation checks", f"failed: {m.get('generation_error')}"))
    for k in (3, 1):
        d = m["mtp_acceptance"].get(f"draft_{k}")
        if d:
            rows.append((f"MTP acceptance, {k} draft{'s' if k > 1 else ''}",
                         f"{d['acceptance_rate']:.1%} ({d['tokens_per_step']:.2f} tokens/step, per depth "
                         f"{', '.join(f'{x:.0%}' for x in d['per_depth_conditional'])})"))
    rows.append(("transformers logit diff", f"{m['transformers_max_abs_logit_diff']:.2e}"))
    return table(rows)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """The whole pipeline; returns the metrics written to metrics.json."""
    t0 = time.time()
    settings = settings_for(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    package_to = Path(args.package_to) if args.package_to else None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_float32_matmul_precision("high")  # TF32 for the float32 parts on the GPU
    stages = {}
    log(f"1bit demo model: device {device}, torch {torch.__version__}, seed {args.seed}, "
        f"{'smoke' if args.smoke else 'full'} settings")
    data = prepare_data(settings, stages, args.seed)

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
    if len(val_windows) == 0 or len(train_tokens) <= 2 * span:
        raise SystemExit("corpus too small for one training or validation window")

    # The training budget is --minutes, but never past --deadline-minutes after start minus a
    # reserve for evaluation and writing the output.
    reserve_s = 60.0
    budget_s = min(args.minutes * 60, args.deadline_minutes * 60 - reserve_s - (time.time() - t0))
    log(f"training for at most {budget_s / 60:.2f} min or {settings.max_epochs:g} epochs"
        + (f" or {settings.max_steps} steps" if settings.max_steps else ""))
    compile_it = device.type == "cuda" and not args.no_compile
    writer = CheckpointWriter(out, package_to, config_dict, data.tok, settings)
    history = train(model, train_tokens, val_windows, settings, device, args.seed, budget_s, compile_it,
                    on_best=writer.on_best)
    stages["train_s"] = history["train_seconds"]

    # The best state is loaded; write it out before anything else can go wrong.
    tick = time.time()
    state = model.export_state()
    writer.write(model, {"partial": True, "best": history["best"], "note": "final weights; evaluation pending"})
    round_to_shipped(model, state)  # evaluate exactly what is shipped: weights rounded to bf16
    result = final_evaluation(model, data, val_tokens, val_windows, settings, device)
    for k in (1, 3):
        d = result["acceptance"].get(f"draft_{k}")
        if d:
            log(f"MTP acceptance, {k} draft(s): {d['acceptance_rate']:.1%} accepted, "
                f"{d['tokens_per_step']:.2f} tokens per step, per depth {d['per_depth_conditional']}")
    generation_error = None
    try:
        result["generation"] = generation_checks(model, out, settings.eval_new_tokens, settings.chat_new_tokens, device)
        for c in result["generation"]["code_prompts"]:
            log(f"--- prompt {c['prompt']!r}: parses {c['parses']} (whole {c['parses_whole']}, to a top-level "
                f"statement {c['parses_to_top_level']}, {'stopped' if c['finished'] else 'token limit'})\n"
                f"{c['prompt']}{c['completion']}")
        chat = result["generation"]["chat"]
        log(f"--- chat {chat['request']!r}: def parses {chat['has_parsing_def']}\n{chat['answer']}\n---")
    except Exception as exc:  # noqa: BLE001 - the weights are out already; report, do not lose the run
        generation_error = f"{type(exc).__name__}: {exc}"
        log(f"generation checks failed: {generation_error}")
    stages["final_eval_s"] = round(time.time() - tick, 1)

    tick = time.time()
    sample = val_windows[:2, :min(64, settings.seq_len)].cpu()
    model.to("cpu")
    check_causal(model, data.vocab)
    result["logit_diff"] = check_against_transformers(model, out, sample)
    stages["check_s"] = round(time.time() - tick, 1)
    log(f"transformers reproduces the logits to {result['logit_diff']:.2e}")

    stages["total_s"] = round(time.time() - t0, 1)
    val_eval_tokens = val_windows.numel() - len(val_windows)
    metrics = build_metrics(args, settings, device, data, counts, history, result, val_eval_tokens, out)
    metrics["stages_s"] = stages
    if generation_error:
        metrics["generation_error"] = generation_error
    write_json(out / "metrics.json", metrics)
    write_model_card(out, metrics, settings, argv)
    if package_to is not None:
        package(out, package_to)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"wrote {out} ({size / 1e6:.1f} MB) in {stages['total_s']} s total"
        + (f", packaged into {package_to}" if package_to else ""))
    log("\n" + summary_table(metrics))
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
    parser.add_argument("--max-epochs", type=float, default=None, help="most passes over the training tokens")
    parser.add_argument("--corpus-mb", type=float, default=None, help="cap on the text kept")
    parser.add_argument("--no-compile", action="store_true", help="never use torch.compile")
    parser.add_argument("--package-to", default=None,
                        help="also write the model as <=15 MiB pieces + one tar here (tools/assemble_demo.py "
                             "rejoins them), during training for the best state so far and at the end")
    args = parser.parse_args(argv)
    run(args, argv)
