"""GGUF model files (llama.cpp's format) in the native engine: find, read, dequantize, tokenize.

`files` finds the file (a path, a directory, split shards, the Hugging Face cache) and opens it;
`metadata` turns its key/values into a ModelConfig; `weights` dequantizes tensor by tensor
onto the device; `vocab` builds the tokenizer; `mtp` maps a nextn (MTP) head.
"""

from __future__ import annotations

from pathlib import Path


def is_gguf(path: str | Path) -> bool:
    """True when `path` names a GGUF file (by its suffix; the magic is checked on opening)."""
    return str(path).lower().endswith(".gguf")
