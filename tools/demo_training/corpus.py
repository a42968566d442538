"""The training text and its tokens: permissively licensed Python source installed on the machine,
split into train/validation by file, a byte-level BPE trained on it, and the token streams."""

from __future__ import annotations

import hashlib
import platform
import re
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tools.demo_training.licences import distribution_license
from tools.demo_training.settings import SPECIAL_TOKENS, STDLIB, STDLIB_LICENSE, VAL_FRACTION, Settings

@dataclass
class SourceFile:
    """One candidate .py file: a stable label (package/relative path), where it is, its size."""

    label: str
    path: Path
    size: int
    source: str


def _stable_hash(label: str) -> int:
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")


def _stdlib_files() -> list[SourceFile]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        # Third-party packages live under the stdlib folder on some layouts; they are judged
        # by their own metadata instead.
        if {"site-packages", "dist-packages", "__pycache__"} & set(rel.parts) or not path.is_file():
            continue
        files.append(SourceFile(f"{STDLIB}/{rel.as_posix()}", path, path.stat().st_size, STDLIB))
    return files


def _package_files(packages: list[dict]) -> list[SourceFile]:
    """Files of installed distributions, from their RECORD; fills `packages` with one row each."""
    seen_names: set[str] = set()
    files = []
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").strip()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if not name or key in seen_names or key == "onebit":
            continue
        seen_names.add(key)
        licence, ok = distribution_license(dist)
        row = {"package": name, "version": dist.version, "license": licence, "permissive": ok,
               "files_found": 0, "files_used": 0, "bytes_used": 0}
        packages.append(row)
        if not ok or dist.files is None:
            continue
        for entry in dist.files:
            if entry.suffix != ".py" or ".." in entry.parts or "__pycache__" in entry.parts:
                continue
            path = Path(dist.locate_file(entry))
            if not path.is_file():
                continue
            row["files_found"] += 1
            files.append(SourceFile(f"{name}/{entry.as_posix()}", path, path.stat().st_size, name))
    return files


def _read_source(path: Path, max_line: int = 1000) -> str | None:
    """The file as text, or None for non-UTF-8 files and data blobs with very long lines."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    text = text.replace("\r\n", "\n")
    if not text.strip() or max(map(len, text.split("\n"))) > max_line:
        return None
    return text


def collect_corpus(settings: Settings) -> tuple[list[tuple[str, str]], list[dict]]:
    """Choose and read the corpus: [(label, text)] in a deterministic order, and the source table.

    The standard library comes first, then permissively licensed packages; inside each, files
    are taken in the order of a hash of their label until `corpus_mb` of text is read, so a cap
    samples every package instead of the alphabetically first ones. Exact duplicates are dropped.
    """
    packages: list[dict] = [{"package": STDLIB, "version": platform.python_version(),
                             "license": STDLIB_LICENSE, "permissive": True,
                             "files_found": 0, "files_used": 0, "bytes_used": 0}]
    stdlib = _stdlib_files()
    packages[0]["files_found"] = len(stdlib)
    third = _package_files(packages) if settings.packages else []
    rows = {row["package"]: row for row in packages}
    max_bytes = settings.max_file_kb * 1024
    ordered = [f for group in (stdlib, third) for f in sorted(group, key=lambda f: (_stable_hash(f.label), f.label))
               if 64 <= f.size <= max_bytes]
    budget = int(settings.corpus_mb * 1e6)
    docs, seen, total = [], set(), 0
    for file in ordered:
        if total >= budget:
            break
        text = _read_source(file.path)
        if text is None:
            continue
        digest = hashlib.sha1(text.encode()).digest()
        if digest in seen:
            continue
        seen.add(digest)
        docs.append((file.label, text))
        total += len(text.encode())
        rows[file.source]["files_used"] += 1
        rows[file.source]["bytes_used"] += len(text.encode())
    return docs, packages


def split_by_file(docs: list[tuple[str, str]], fraction: float = VAL_FRACTION):
    """(train, val) documents: a file is held out when the hash of its label falls under `fraction`."""
    cut = int(fraction * 2**64)
    val = [d for d in docs if _stable_hash("val:" + d[0]) < cut]
    if not val:  # a tiny corpus still needs a held-out file
        val = [min(docs, key=lambda d: _stable_hash("val:" + d[0]))]
    names = {label for label, _ in val}
    return [d for d in docs if d[0] not in names], val


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    """Byte-level BPE with the ChatML specials at ids 0-2; total vocab (specials included) `vocab`."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok: Tokenizer, texts: list[str], chunk: int = 2048) -> np.ndarray:
    """All documents as one int32 token stream, each followed by `<|endoftext|>`."""
    eot = tok.token_to_id("<|endoftext|>")
    parts = []
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast skips offsets
    for start in range(0, len(texts), chunk):
        for enc in encode(texts[start:start + chunk], add_special_tokens=False):
            parts.append(np.asarray(enc.ids, dtype=np.int32))
            parts.append(np.asarray([eot], dtype=np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
