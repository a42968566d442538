"""The output directory of a run: bf16 safetensors with `mtp.*`, config, tokenizer and generation
files, and the check that transformers' loader reproduces the training model's logits."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from onebit.testing.tiny import tokenizer_config  # one ChatML setup for the project
from tools.demo_training.model import DemoModel, load_demo


def write_json(path: Path, data) -> None:
    """`data` as indented UTF-8 JSON with a final newline."""
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def round_to_shipped(model: DemoModel, state: dict[str, torch.Tensor]) -> None:
    """Copy the bf16 export `state` back into `model`, so evaluation sees exactly what is shipped."""
    with torch.no_grad():
        for name, param in list(model.lm.named_parameters()) + [("mtp." + n, p) for n, p in model.mtp.named_parameters()]:
            if name in state:
                param.copy_(state[name].float())


def write_model_dir(out: Path, state: dict[str, torch.Tensor], config_dict: dict, tok: Tokenizer,
                    max_position_embeddings: int) -> None:
    """Weights, config.json, tokenizer.json, tokenizer_config.json and generation_config.json."""
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    write_json(out / "config.json", config_dict)
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(tok, max_position_embeddings))
    endoftext, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    write_json(out / "generation_config.json", {
        "bos_token_id": endoftext, "eos_token_id": [endoftext, im_end], "pad_token_id": endoftext,
        "do_sample": False,
    })


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
