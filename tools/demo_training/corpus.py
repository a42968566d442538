"""The training text and its tokens: permissively licensed Python source installed on the machine,
read and deduplicated in parallel, split into train/validation by file, a byte-level BPE trained on
it, and the token streams (code documents, plus chat pairs made from the code: instructions.py)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import platform
import re
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tools.demo_training.instructions import function_pairs, shorten_docstrings
from tools.demo_training.licences import distribution_license
from tools.demo_training.settings import SPECIAL_TOKENS, STDLIB, STDLIB_LICENSE, VAL_FRACTION, Settings


@dataclass
class SourceFile:
    """One candidate .py file: a stable label (package/relative path), where it is, its size, its source."""

    label: str
    path: Path
    size: int
    source: str


@dataclass
class Corpus:
    """What `collect_corpus` read: the kept documents in order, the chat pairs made from the
    training files, the per-source table and the deduplication counts."""

    docs: list[tuple[str, str]]
    pairs: list[tuple[str, str, str]]  # (label of the file, user request, assistant answer)
    sources: list[dict]
    dedup: dict = field(default_factory=dict)


def stable_hash(label: str) -> int:
    """A 64-bit hash of a string that does not change between runs (unlike hash())."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")


def is_validation(label: str, fraction: float = VAL_FRACTION) -> bool:
    """Whether the file with this label is held out (a hash of the label falls under `fraction`)."""
    return stable_hash("val:" + label) < int(fraction * 2**64)


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


def read_source(path: Path, max_line: int = 1000) -> str | None:
    """The file as text, or None for non-UTF-8 files and data blobs with very long lines."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    text = text.replace("\r\n", "\n")
    if not text.strip() or max(map(len, text.split("\n"))) > max_line:
        return None
    return text


def normalized_digest(text: str) -> bytes:
    """Hash of the code with indentation, blank lines and whole-line comments removed: files that
    differ only in those (re-indented or re-commented vendored copies) get the same digest."""
    lines = (line.strip() for line in text.split("\n"))
    return hashlib.sha1("\n".join(s for s in lines if s and not s.startswith("#")).encode()).digest()


def _load_one(item: tuple[str, str]) -> tuple[str, str, bytes, bytes, list] | None:
    """Worker: read one file, hash it two ways, and (training files only) make its chat pairs."""
    label, path = item
    text = read_source(Path(path))
    if text is None:
        return None
    exact = hashlib.sha1(text.encode()).digest()
    pairs = [] if is_validation(label) else function_pairs(text, label)
    return label, shorten_docstrings(text), exact, normalized_digest(text), pairs


def _map(items: list, workers: int):
    """`_load_one` over `items` in order, on `workers` processes (in this process when 1)."""
    if workers <= 1 or len(items) < 64:
        yield from map(_load_one, items)
        return
    # fork: the workers need nothing but this module; spawn would re-import torch in each.
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        yield from pool.imap(_load_one, items, chunksize=32)


def collect_corpus(settings: Settings, workers: int | None = None) -> Corpus:
    """Choose and read the corpus: documents in a deterministic order, chat pairs, the source table.

    The standard library comes first, then permissively licensed packages; inside each, files
    are taken in the order of a hash of their label until `corpus_mb` of text is kept, so a cap
    samples every package instead of the alphabetically first ones. A file whose exact text or
    normalized text (`normalized_digest`) was already kept is dropped as a duplicate.
    """
    workers = workers or min(16, os.cpu_count() or 1)
    packages: list[dict] = [{"package": STDLIB, "version": platform.python_version(),
                             "license": STDLIB_LICENSE, "permissive": True,
                             "files_found": 0, "files_used": 0, "bytes_used": 0}]
    stdlib = _stdlib_files()
    packages[0]["files_found"] = len(stdlib)
    third = _package_files(packages) if settings.packages else []
    rows = {row["package"]: row for row in packages}
    max_bytes = settings.max_file_kb * 1024
    ordered = [f for group in (stdlib, third) for f in sorted(group, key=lambda f: (stable_hash(f.label), f.label))
               if 64 <= f.size <= max_bytes]
    # Read a little more than the cap (some files are dropped), not the whole disk for a small cap.
    budget = int(settings.corpus_mb * 1e6)
    chosen, planned = [], 0
    for file in ordered:
        if planned >= 1.5 * budget + 1e6:
            break
        chosen.append(file)
        planned += file.size
    source_of = {f.label: f.source for f in chosen}
    docs, pairs, exact_seen, norm_seen, total = [], [], set(), set(), 0
    dedup = {"candidates": len(chosen), "unreadable": 0, "exact_duplicates": 0, "near_duplicates": 0}
    for result in _map([(f.label, str(f.path)) for f in chosen], workers):
        if total >= budget:
            continue  # drain the pool
        if result is None:
            dedup["unreadable"] += 1
            continue
        label, text, exact, norm, file_pairs = result
        if exact in exact_seen:
            dedup["exact_duplicates"] += 1
            continue
        if norm in norm_seen:
            dedup["near_duplicates"] += 1
            continue
        exact_seen.add(exact)
        norm_seen.add(norm)
        docs.append((label, text))
        pairs += [(label, q, a) for q, a in file_pairs]
        size = len(text.encode())
        total += size
        row = rows[source_of[label]]
        row["files_used"] += 1
        row["bytes_used"] += size
    return Corpus(docs, pairs, packages, dedup)


def split_by_file(docs: list[tuple[str, str]], fraction: float = VAL_FRACTION):
    """(train, val) documents: a file is held out when `is_validation` says so."""
    val = [d for d in docs if is_validation(d[0], fraction)]
    if not val:  # a tiny corpus still needs a held-out file
        val = [min(docs, key=lambda d: stable_hash("val:" + d[0]))]
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


def encode_docs(tok: Tokenizer, texts: list[str], specials: bool, chunk: int = 4096) -> list[np.ndarray]:
    """Token ids of every text (int32), with the tokenizer's batch encoder (parallel in Rust).

    specials=False: special-token strings inside the text stay text (source files that mention
    `<|im_end|>`), as the server tokenizes user text; True: they are the special tokens (the
    rendered chat pairs, as the server's chat template produces them).
    """
    enc_tok = Tokenizer.from_str(tok.to_str())
    enc_tok.encode_special_tokens = not specials
    encode = getattr(enc_tok, "encode_batch_fast", enc_tok.encode_batch)  # _fast skips offsets
    out = []
    for start in range(0, len(texts), chunk):
        out += [np.asarray(enc.ids, dtype=np.int32) for enc in encode(texts[start:start + chunk],
                                                                       add_special_tokens=False)]
    return out


def join_stream(parts: list[np.ndarray], eot: int) -> np.ndarray:
    """One int32 stream: every document followed by `<|endoftext|>`."""
    if not parts:
        return np.zeros(0, dtype=np.int32)
    sep = np.asarray([eot], dtype=np.int32)
    return np.concatenate([x for part in parts for x in (part, sep)])


def encode_stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """All code documents as one int32 token stream, each followed by `<|endoftext|>`."""
    return join_stream(encode_docs(tok, texts, specials=False), tok.token_to_id("<|endoftext|>"))
