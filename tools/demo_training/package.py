"""Carry a model directory out of a device call whose output files are limited in size and
number: model.safetensors cut into pieces of at most PART_BYTES, the other files in one tar with
a manifest (the full file's sha256); `assemble` puts the directory back together and checks it."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

PART_BYTES = 15 * 2**20
WEIGHTS = "model.safetensors"
TAR_NAME = "demo_model_files.tar"
MANIFEST = "PARTS.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def _replace(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)  # atomic: a run killed mid-write leaves the previous complete file


def package(model_dir: Path, dest: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """Write `dest`/model.safetensors.partNN (each <= part_bytes) and `dest`/demo_model_files.tar
    (every other file of `model_dir` plus PARTS.json). Returns the files written."""
    dest.mkdir(parents=True, exist_ok=True)
    weights = model_dir / WEIGHTS
    data = weights.read_bytes()
    count = max(1, -(-len(data) // part_bytes))
    written = []
    for old in dest.glob(WEIGHTS + ".part*"):
        if int(old.name.rsplit("part", 1)[1].split(".")[0] or 0) >= count:
            old.unlink()  # a previous package had more pieces
    for i in range(count):
        part = dest / f"{WEIGHTS}.part{i:02d}"
        tmp = part.with_suffix(".tmp")
        tmp.write_bytes(data[i * part_bytes:(i + 1) * part_bytes])
        _replace(tmp, part)
        written.append(part)
    manifest = {"file": WEIGHTS, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                "parts": [p.name for p in written]}
    (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    tmp = dest / (TAR_NAME + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        for path in sorted(model_dir.iterdir()):
            if path.is_file() and path.name != WEIGHTS:
                tar.add(path, arcname=path.name)
    _replace(tmp, dest / TAR_NAME)
    return written + [dest / TAR_NAME]


def assemble(src: Path, target: Path) -> dict:
    """Rebuild the model directory in `target` from a package in `src`; raises ValueError when a
    piece is missing or the joined weights do not match the manifest's sha256."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src / TAR_NAME) as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or member.name.startswith("."):
                raise ValueError(f"unexpected entry in {TAR_NAME}: {member.name}")
        tar.extractall(target, filter="data")
    manifest = json.loads((target / MANIFEST).read_text())
    tmp = target / (WEIGHTS + ".tmp")
    with tmp.open("wb") as out:
        for name in manifest["parts"]:
            part = src / name
            if not part.is_file():
                raise ValueError(f"missing piece {name} in {src}")
            out.write(part.read_bytes())
    if tmp.stat().st_size != manifest["bytes"] or _sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise ValueError("the joined model.safetensors does not match PARTS.json (size or sha256)")
    _replace(tmp, target / WEIGHTS)
    (target / MANIFEST).unlink()
    return manifest
