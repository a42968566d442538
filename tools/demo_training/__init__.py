"""Train 1bit's built-in demo model: a small Qwen3 code model with a multi-token-prediction head.

    PYTHONPATH=. python3 tools/train_demo.py --out DIR [--minutes 6.5] [--seed 0] [--smoke]

One run does everything, offline: collect permissively licensed Python source installed on the
machine (the standard library first, then site-packages whose metadata says BSD/MIT/Apache/PSF
or similar), split it into train/validation by file, train a byte-level BPE tokenizer, train a
Qwen3ForCausalLM jointly with an MTP head (loss on token t+2, layout in tools/mtp_layout.md) for
a fixed wall-clock budget, measure greedy speculative-decoding acceptance of the head on held-out
prompts, and write a Hugging Face model directory (config, bf16 safetensors with `mtp.*` beside
the base weights, tokenizer files, generation config, metrics.json, MODEL_CARD.md).

Modules, in pipeline order: settings (every knob), licences (which packages may be read), corpus
(files, split, tokenizer, token streams), model (Qwen3 + MTP head), training (the loop),
acceptance (how well the head drafts), export (the model directory), card (MODEL_CARD.md),
cli (one run end to end, and the command line).

`--smoke` is a tiny configuration (2 layers, hidden 64, vocab 512, a few hundred KB of stdlib
text, 20 steps) that finishes on a CPU in seconds; the tests run it.
"""

from tools.demo_training.cli import main, run, windows
from tools.demo_training.licences import spdx_is_permissive
from tools.demo_training.model import DemoModel, build_qwen3_config, check_causal, load_demo
from tools.demo_training.settings import SMOKE, Settings
from tools.demo_training.training import train

__all__ = ["SMOKE", "DemoModel", "Settings", "build_qwen3_config", "check_causal", "load_demo", "main", "run",
           "spdx_is_permissive", "train", "windows"]
