"""The built-in default model: a small trained Python code model shipped inside the package.

Trained by tools/train_demo.py (see onebit/assets/demo/MODEL_CARD.md); its checkpoint also
carries a multi-token-prediction head under `mtp.*`.
"""

from __future__ import annotations

from pathlib import Path

from onebit.models.errors import ModelLoadError

DEMO_DIR = Path(__file__).resolve().parent.parent / "assets" / "demo"


def default_model_dir() -> Path:
    """The packaged demo model's directory; ModelLoadError if the install lacks it."""
    if not (DEMO_DIR / "config.json").is_file() or not (DEMO_DIR / "model.safetensors").is_file():
        raise ModelLoadError(f"the built-in model is missing from this install ({DEMO_DIR}); "
                             "reinstall 1bit or pass -m MODEL")
    return DEMO_DIR
