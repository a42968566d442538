"""Which pooling a model's embeddings use, from its files: sentence-transformers' `1_Pooling/config.json`."""

from __future__ import annotations

import json
from pathlib import Path

# sentence-transformers' switch names -> our pooling kinds
_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}


def model_pooling(path: str | Path, default: str = "last") -> str:
    """The pooling the model directory declares, else `default` (last token: what a causal model's
    final state summarizes)."""
    config = Path(path) / "1_Pooling" / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return default
    for key, kind in _MODES.items():
        if isinstance(data, dict) and data.get(key) is True:
            return kind
    return default
