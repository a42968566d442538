"""MODEL_CARD.md of a trained demo model: data and licences, size, losses, acceptance, how to reproduce."""

from __future__ import annotations

from pathlib import Path

from tools.demo_training.settings import MTP_LOSS_WEIGHT, VAL_FRACTION, Settings

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
