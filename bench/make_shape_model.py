"""Write a model directory with a real model's shape, for `--load-format dummy` runs or, with
`--weights`, with random weights on disk (for servers that need a checkpoint, e.g. llama.cpp's GGUF).

    python3 bench/make_shape_model.py DIR [--shape qwen3-8b] [--fill-vocab] [--weights --device cuda]

The tokenizer is the tiny model's (byte-level BPE, 1024 tokens); prompts are random token ids
anyway. Ids past it have no text, so most generated tokens of a random 152k-vocab model stream as
empty strings; `--fill-vocab` gives each of them a text (" [ID]"), as a real tokenizer would.
`--weights` draws the weights with our dummy loader on `--device` (the same random weights
`--load-format dummy` gives) and writes them, in the config's dtype, as Hugging Face safetensors
shards with transformers' parameter names.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
}
# The same layout at toy size, to try the scripts that use qwen3-8b on a CPU.
SHAPES["qwen3-tiny"] = {
    **SHAPES["qwen3-8b"], "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024,
    "max_position_embeddings": 4096, "bos_token_id": 1019, "eos_token_id": 1021,
}

INDEX = "model.safetensors.index.json"


def make_shape_model(out: Path, shape: str = "qwen3-8b") -> Path:
    """Write config.json for `shape` plus the tiny model's tokenizer files into `out`."""
    from onebit.testing.tiny import make_tiny_model
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tiny = make_tiny_model(Path(tmp) / "tiny", arch="qwen3", vocab=1024)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(tiny / name, out / name)
    (out / "config.json").write_text(json.dumps(SHAPES[shape], indent=1))
    return out


def fill_vocab(out: Path) -> int:
    """Give every id past the tokenizer's last one, up to config.json's vocab_size, a text of its own
    (" [ID]", an ordinary BPE entry that no merge produces); return how many were added.

    The added tokens (specials) are entered in the BPE vocab too, under their own ids: `tokenizers`
    numbers added tokens that the model vocab lacks after the model vocab's size, so the vocab has
    to be contiguous for them to keep their ids."""
    vocab_size = json.loads((out / "config.json").read_text())["vocab_size"]
    tok = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tok["model"]["vocab"]
    for added in tok.get("added_tokens", []):
        if vocab.setdefault(added["content"], added["id"]) != added["id"]:
            raise ValueError(f"added token {added['content']!r} has another id in the vocab")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError("tokenizer ids are not contiguous")
    start = len(vocab)
    for i in range(start, vocab_size):
        text = f"\u0120[{i}]"  # byte-level BPE writes a leading space as U+0120
        while text in vocab:
            text += "_"
        vocab[text] = i
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    return max(0, vocab_size - start)


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """Our fused weights split back into transformers' parameter names (views, no copies)."""
    cfg = model.cfg
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    out = {}
    for name, p in model.named_parameters():
        hf = "lm_head.weight" if name == "lm_head.weight" else "model." + name
        if "qkv_proj" in name:
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), p.data.split([q, kv, kv])):
                out[hf.replace("qkv_proj", part)] = chunk
        elif "gate_up_proj" in name:
            for part, chunk in zip(("gate_proj", "up_proj"), p.data.split([inter, inter])):
                out[hf.replace("gate_up_proj", part)] = chunk
        else:
            out[hf] = p.data
    return out


def save_sharded(tensors: dict[str, torch.Tensor], out: Path, shard_bytes: int = 4 << 30) -> list[Path]:
    """Write `tensors` as safetensors shards of about `shard_bytes` (copied to the CPU one shard at a
    time) plus model.safetensors.index.json, written last; return the shard paths."""
    from safetensors.torch import save_file

    groups: list[list[str]] = [[]]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    (out / INDEX).unlink(missing_ok=True)
    files, weight_map, total = [], {}, 0
    for i, names in enumerate(groups):
        file = out / f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {n: tensors[n].to("cpu").contiguous() for n in names}
        save_file(shard, str(file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in shard.values())
        weight_map.update({n: file.name for n in names})
        files.append(file)
        del shard
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return files


def write_random_weights(out: Path, device: str = "cpu", shard_bytes: int = 4 << 30) -> list[Path]:
    """Draw the model of `out`/config.json with our dummy loader on `device`, in the config's dtype,
    and save it into `out` as safetensors shards with transformers' names."""
    from onebit.models.loader import load_model

    dtype = getattr(torch, json.loads((out / "config.json").read_text()).get("torch_dtype") or "float32")
    for old in out.glob("*.safetensors"):
        old.unlink()
    model, _ = load_model(out, torch.device(device), dtype, "dummy")
    with torch.no_grad():
        files = save_sharded(hf_state_dict(model), out, shard_bytes)
    del model
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--fill-vocab", action="store_true",
                    help="give every id past the tiny tokenizer a text (see above)")
    ap.add_argument("--weights", action="store_true", help="also write random weights as safetensors")
    ap.add_argument("--device", default="cpu", help="where the weights are drawn (cuda is much faster)")
    ap.add_argument("--shard-gb", type=float, default=4.0, help="size of one safetensors shard")
    args = ap.parse_args()
    make_shape_model(args.out, args.shape)
    if args.fill_vocab:
        fill_vocab(args.out)
    if args.weights:
        t0 = time.perf_counter()
        files = write_random_weights(args.out, args.device, int(args.shard_gb * (1 << 30)))
        size = sum(f.stat().st_size for f in files) / 1e9
        print(f"wrote {len(files)} safetensors shards, {size:.1f} GB, in {time.perf_counter() - t0:.1f}s",
              flush=True)
    print(args.out)


if __name__ == "__main__":
    main()
