"""Tiny random-weight models in the real Hugging Face layout, generated deterministically.

    python -m onebit.testing.tiny OUT_DIR --arch qwen3 --layers 2 --hidden 64

Same arguments, same bytes: weights come from a seeded torch.Generator and the byte-level BPE
tokenizer is trained on the built-in text in `tiny_corpus`. transformers loads the result, so
tests can compare our engine against its reference implementation on identical weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from onebit.testing.tiny_corpus import CORPUS

ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]
# Fills the vocab when the corpus yields fewer merges than asked for.
_RESERVED = "<|reserved_{}|>"

# ChatML with Qwen3-style thinking switch and tool calls. Jinja escapes (\n) are in a raw
# string so the template file reads like the ones models ship.
CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\nYou may call one or more functions to help with the request. Their signatures, one JSON object a line:\n<tools>\n' }}
{%- for tool in tools %}{{- tool | tojson }}{{- '\n' }}{%- endfor %}
{{- '</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments between <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{%- set content = message.content or '' %}
{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}
{{- '<|im_start|>assistant\n' + content }}
{%- for call in message.tool_calls or [] %}
{%- set fn = call.function if call.function is defined else call %}
{%- if content or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}{{- fn.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
"""


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_tokenizer(vocab: int) -> Tokenizer:
    """Train the byte-level BPE on the built-in corpus; total size (with added tokens) == vocab."""
    n_added = len(SPECIAL_TOKENS) + len(THINK_TOKENS)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab < len(alphabet) + n_added:
        raise ValueError(f"vocab must be at least {len(alphabet) + n_added} (256 bytes + {n_added} added tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab - n_added, initial_alphabet=alphabet, special_tokens=[], show_progress=False
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    # A vocab larger than the corpus supports is filled with reserved specials, so that the
    # tokenizer and config.json always agree on the size.
    shortfall = vocab - n_added - tok.get_vocab_size(with_added_tokens=True)
    tok.add_special_tokens([_RESERVED.format(i) for i in range(shortfall)] + SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, normalized=False) for t in THINK_TOKENS])
    assert tok.get_vocab_size(with_added_tokens=True) == vocab
    return tok


def tokenizer_config(tok: Tokenizer, max_position_embeddings: int) -> dict:
    """tokenizer_config.json for a byte-level BPE with our specials: ChatML template, eos <|im_end|>,
    pad <|endoftext|> (shared with tools/train_demo.py)."""
    added = {
        str(i): {
            "content": t.content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": t.special,
        }
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }


def _model_config(arch: str, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int,
                  intermediate: int, tie: bool, max_pos: int, bos: int, eos: int) -> dict:
    config = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0 if arch.startswith("qwen") else 10000.0,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": tie,
        "torch_dtype": "float32",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "attention_bias": arch == "qwen2",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if arch in ("qwen2", "qwen3", "mistral"):
        config.update(sliding_window=None, use_sliding_window=False)
    if arch == "llama":
        config["mlp_bias"] = False
    return config


def _weights(arch: str, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int,
             intermediate: int, tie: bool, seed: int, mtp: bool = False) -> dict[str, torch.Tensor]:
    """Random weights with the exact HF names, drawn in a fixed order from one generator."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads

    def normal(*shape: int, std: float | None = None) -> torch.Tensor:
        # Default std 1/sqrt(fan_in): at these widths a literal 0.02 would make every layer
        # nearly the identity (0.02 is ~1/sqrt(hidden) only for hidden ~2500).
        std = shape[-1] ** -0.5 if std is None else std
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def norm(size: int) -> torch.Tensor:
        return 1.0 + normal(size, std=0.1)  # not all ones, so a wrong norm shows in the output

    # Embedding/lm_head scaled so logits have std ~1: sampling is neither uniform nor greedy.
    tensors = {"model.embed_tokens.weight": normal(vocab, hidden, std=hidden ** -0.5)}

    def decoder_layer(p: str) -> None:
        tensors[p + "input_layernorm.weight"] = norm(hidden)
        tensors[p + "self_attn.q_proj.weight"] = normal(heads * head_dim, hidden)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_heads * head_dim, hidden)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_heads * head_dim, hidden)
        if arch == "qwen2":
            tensors[p + "self_attn.q_proj.bias"] = normal(heads * head_dim, std=0.1)
            tensors[p + "self_attn.k_proj.bias"] = normal(kv_heads * head_dim, std=0.1)
            tensors[p + "self_attn.v_proj.bias"] = normal(kv_heads * head_dim, std=0.1)
        if arch == "qwen3":
            tensors[p + "self_attn.q_norm.weight"] = norm(head_dim)
            tensors[p + "self_attn.k_norm.weight"] = norm(head_dim)
        tensors[p + "self_attn.o_proj.weight"] = normal(hidden, heads * head_dim)
        tensors[p + "post_attention_layernorm.weight"] = norm(hidden)
        tensors[p + "mlp.gate_proj.weight"] = normal(intermediate, hidden)
        tensors[p + "mlp.up_proj.weight"] = normal(intermediate, hidden)
        tensors[p + "mlp.down_proj.weight"] = normal(hidden, intermediate)

    for i in range(layers):
        decoder_layer(f"model.layers.{i}.")
    tensors["model.norm.weight"] = norm(hidden)
    if not tie:
        tensors["lm_head.weight"] = normal(vocab, hidden, std=hidden ** -0.5)
    if mtp:  # drawn last, so the base weights are the same bytes with or without the head
        tensors["mtp.pre_fc_norm_embedding.weight"] = norm(hidden)
        tensors["mtp.pre_fc_norm_hidden.weight"] = norm(hidden)
        tensors["mtp.fc.weight"] = normal(hidden, 2 * hidden)
        decoder_layer("mtp.layers.0.")
        tensors["mtp.norm.weight"] = norm(hidden)
    return tensors


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen3",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 512,
    seed: int = 0,
    tie_word_embeddings: bool | None = None,
    intermediate: int | None = None,
    max_position_embeddings: int = 4096,
    mtp: bool = False,
) -> Path:
    """Write a tiny model directory (config, safetensors, tokenizer files) and return its path.

    `tie_word_embeddings=None` picks the family's habit for small models: tied for Qwen,
    untied for Llama and Mistral. `intermediate` defaults to 3 * hidden. `mtp` adds a random
    multi-token-prediction head under `mtp.*` (layout: tools/mtp_layout.md).
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    if hidden % heads or heads % kv_heads:
        raise ValueError("hidden must be a multiple of heads, and heads a multiple of kv_heads")
    tie = arch.startswith("qwen") if tie_word_embeddings is None else tie_word_embeddings
    intermediate = intermediate or 3 * hidden
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = build_tokenizer(vocab)
    tok.save(str(out / "tokenizer.json"))
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    _write_json(out / "tokenizer_config.json", tokenizer_config(tok, max_position_embeddings))
    _write_json(out / "generation_config.json", {
        "bos_token_id": endoftext, "eos_token_id": [im_end, endoftext], "pad_token_id": endoftext,
    })
    shape = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vocab=vocab,
                 intermediate=intermediate, tie=tie)
    _write_json(out / "config.json", _model_config(
        arch, **shape, max_pos=max_position_embeddings, bos=endoftext, eos=im_end))
    if mtp:
        config = json.loads((out / "config.json").read_text())
        _write_json(out / "config.json", {**config, "num_nextn_predict_layers": 1})
    save_file(_weights(arch, **shape, seed=seed, mtp=mtp), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line entry: write a tiny model to OUT_DIR."""
    parser = argparse.ArgumentParser(prog="python -m onebit.testing.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="qwen3")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--max-position-embeddings", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tie", action=argparse.BooleanOptionalAction, default=None,
                        help="tie lm_head to the embedding (default: tied for qwen, untied otherwise)")
    parser.add_argument("--mtp", action="store_true", help="add a random multi-token-prediction head (mtp.*)")
    args = parser.parse_args(argv)
    try:
        path = make_tiny_model(
            args.out_dir, arch=args.arch, layers=args.layers, hidden=args.hidden, heads=args.heads,
            kv_heads=args.kv_heads, vocab=args.vocab, seed=args.seed, tie_word_embeddings=args.tie,
            intermediate=args.intermediate, max_position_embeddings=args.max_position_embeddings, mtp=args.mtp,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(path)


if __name__ == "__main__":
    main()
