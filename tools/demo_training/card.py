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
    data = m["data"]
    chat = data.get("chat_pairs") or {}
    dropped = data.get("dropped") or {}
    train = m["training"]
    best = m.get("best_checkpoint") or {}
    lines = [
        "# 1bit demo code model", "",
        "A small Qwen3-architecture model trained from scratch on permissively licensed Python source, "
        "with a jointly trained multi-token-prediction (MTP) head. It is 1bit's built-in default: it "
        "continues Python code through /v1/completions, answers simple \"write a function that ...\" requests "
        "through /v1/chat/completions (it saw such requests made from the documented functions of its own "
        "corpus, in its ChatML template), and its head gives honest speculative-decoding figures. It is a "
        "demo, not an assistant: it knows only Python source and cannot hold a conversation.", "",
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
        f"Every Python source file of the training machine's installation (Python {data['python']}) whose "
        "licence is permissive: the standard library, then every installed package whose metadata declares a "
        f"permissive licence (files up to {settings.max_file_kb} KB, up to a cap of {settings.corpus_mb:g} MB). "
        f"Of {_fmt_int(dropped.get('candidates', 0))} candidate files, {_fmt_int(dropped.get('unreadable', 0))} were "
        "dropped as non-UTF-8 or with lines over 1000 characters, "
        f"{_fmt_int(dropped.get('exact_duplicates', 0))} as exact duplicates of a file already kept and "
        f"{_fmt_int(dropped.get('near_duplicates', 0))} as near duplicates (the same code once indentation, blank "
        f"lines and comment lines are removed; vendored copies). {VAL_FRACTION:.0%} of files (chosen by a hash of "
        f"the path) are held out for validation. Corpus: {data['files']} files, {data['bytes'] / 1e6:.1f} MB; "
        f"{_fmt_int(data['train_tokens'])} training tokens (chat pairs included), {_fmt_int(data['val_tokens'])} "
        f"held-out tokens ({data['val_files']} files). Every multi-line docstring of a function or class "
        "(training and held-out files alike) is cut to a one-line docstring of its first sentence: trained on "
        "the long numpy-style docstrings as they are, the model spent whole 64-token completions inside one "
        "(1 of 5 code prompts parsed, against 4 of 5 after the cut; module docstrings stay).", "",
        f"Chat pairs: {_fmt_int(chat.get('pairs', 0))} (of {_fmt_int(chat.get('pairs_found', 0))} found) made from "
        "the training files themselves: for a public, undecorated top-level function of 3-40 lines whose "
        "docstring starts with a plain sentence, the request \"Write a Python function `name(args)` to/that "
        "<that sentence>.\" (every other one without the signature: \"Write a Python function to ...\") and the "
        "answer \"```python\\n<the function>\\n```\", with its docstring for half of them and without for the "
        "other half; rendered exactly as the chat template renders a user turn, the generation prompt "
        "(`<|im_start|>assistant\\n`), the answer and `<|im_end|>`, and shuffled into the code documents: "
        f"{_fmt_int(chat.get('tokens', 0))} tokens, {chat.get('token_fraction', 0):.1%} of the training tokens. "
        "The loss is on every token of a pair (the request too), like code.", "",
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
        f"- {train['steps']} AdamW steps (betas 0.9/0.95, weight decay {settings.weight_decay}, peak lr "
        f"{settings.lr}, {settings.warmup_steps} warm-up steps, cosine to {settings.min_lr_ratio:g}x, gradient clip "
        f"{settings.grad_clip}), batch {train['batch_size']} x {settings.seq_len} tokens, "
        f"{train['tokens_seen'] / 1e6:.1f}M tokens seen in {train['train_seconds']:.0f} s on "
        f"{m['device']} ({train['step_mode']}, {train['precision']}), seed {m['seed']}: "
        f"{train.get('epochs', 0):.2f} passes over the training tokens (at most {settings.max_epochs:g}: each "
        f"epoch visits every non-overlapping {settings.seq_len + 1}-token window once, in a shuffled order, the second one cut "
        "half a window further on).",
        f"- Best checkpoint: validation every {settings.val_every_s:g} s and at the end; the shipped weights are "
        f"those with the lowest validation base loss + {MTP_LOSS_WEIGHT} x MTP loss, from step "
        f"{best.get('step')} of {train['steps']}.",
        f"- Validation loss per token of the shipped bf16 weights: **{m['final_val_loss']:.4f}** (MTP, token t+2: "
        f"{m['final_val_mtp_loss']:.4f}); {m['final_val_bits_per_byte']:.3f} bits per byte of held-out source.",
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
    gen = m.get("generation_checks")
    if gen:
        lines += ["", "## Greedy checks", "",
                  "Measured by the training run on the shipped bf16 weights (float32 compute), prompts tokenized "
                  "and the chat request rendered by 1bit's own tokenizer class, as `1bit serve` does. A "
                  f"completion is {settings.eval_new_tokens} tokens or up to a stop token; it counts as Python "
                  "when prompt + completion parses with `ast` after its unfinished last line is dropped "
                  "(\"whole\"), or when it parses up to the last line starting at column 0 (\"to a top-level "
                  "statement\": the asked-for definition is complete and the next was cut).", "",
                  "| prompt | parses | how |", "|---|---|---|"]
        for c in gen["code_prompts"]:
            how = "whole" if c["parses_whole"] else "to a top-level statement" if c["parses_to_top_level"] else "no"
            prompt = c["prompt"].replace("\n", "\\n")
            lines.append(f"| `{prompt}` | {'yes' if c['parses'] else 'no'} | {how} |")
        chat_check = gen["chat"]
        lines += ["", f"Chat request \"{chat_check['request']}\": the answer "
                  f"{'holds' if chat_check['has_parsing_def'] else 'does NOT hold'} a `def` that parses "
                  f"({'it ended by itself' if chat_check['finished'] else 'cut at the token limit'}). The answer:",
                  "", "````", chat_check["answer"], "````"]
    lines += [
        "", "## Licence", "",
        "The weights are released under Apache-2.0, like 1bit; the training data's licences are listed above.", "",
        "## Reproduce", "",
        "```", "PYTHONPATH=. python3 " + " ".join(["tools/train_demo.py"] + argv), "```", "",
        "The corpus depends on the Python installation (versions above); the seed fixes initialisation, "
        "batches and the split, while the number of steps follows the wall-clock budget or the epoch cap.", "",
    ]
    (out / "MODEL_CARD.md").write_text("\n".join(lines), encoding="utf-8")
