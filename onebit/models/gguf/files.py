"""Find a GGUF model on local disk (file, directory, split shards, Hugging Face cache) and open it."""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from onebit.models.errors import ModelLoadError

_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_MAGIC = b"GGUF"


def model_name(path: Path) -> str:
    """The served model name for a GGUF file: its name without `.gguf` and without a split suffix."""
    match = _SPLIT.match(path.name)
    if match:
        return match["stem"]
    return path.name[:-len(".gguf")] if path.name.lower().endswith(".gguf") else path.name


def shard_paths(path: Path) -> list[Path]:
    """All files of the model `path` belongs to: the shards 1..N of a split file, else [path]."""
    match = _SPLIT.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    shards = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise ModelLoadError(f"split GGUF model {match['stem']} lacks {len(missing)} of its {count} files: "
                             + ", ".join(missing))
    return shards


def _candidates(directory: Path) -> list[Path]:
    """Model files under `directory`: whole files and first shards, not projector (mmproj) files."""
    found = []
    for path in sorted(directory.rglob("*.gguf")):
        match = _SPLIT.match(path.name)
        if path.name.lower().startswith("mmproj") or (match and int(match["index"]) != 1):
            continue
        found.append(path)
    return found


def _quant_matches(path: Path, directory: Path, quant: str) -> bool:
    """True when `quant` (e.g. Q4_K_M) appears in the file's relative path between separators."""
    text = str(path.relative_to(directory)).upper()
    return re.search(rf"(^|[-./]){re.escape(quant.upper())}([-./]|$)", text) is not None


def choose_gguf(directory: Path, gguf_file: str | None = None, quant: str | None = None) -> Path:
    """The one GGUF model file in `directory`, picked by file name or quantization tag when there are several."""
    found = _candidates(directory)
    listing = ", ".join(str(p.relative_to(directory)) for p in found)
    if not found:
        raise ModelLoadError(f"no .gguf model file in {directory}")
    if gguf_file is not None:
        chosen = [p for p in found if gguf_file in (p.name, str(p.relative_to(directory)), model_name(p))]
        what = f"--gguf-file {gguf_file}"
    elif quant is not None:
        chosen = [p for p in found if _quant_matches(p, directory, quant)]
        what = f"quantization {quant}"
    else:
        chosen, what = found, "several GGUF models"
    if len(chosen) == 1:
        return chosen[0]
    if not chosen:
        raise ModelLoadError(f"{what} matches no GGUF file in {directory}; there are: {listing}")
    raise ModelLoadError(f"{what} in {directory}: choose one with --gguf-file NAME or -m MODEL:QUANT "
                         f"among: {', '.join(str(p.relative_to(directory)) for p in chosen)}")


@dataclass
class GGUFFile:
    """An opened GGUF model: the metadata of its first shard and the tensors of all its shards."""

    path: Path
    shards: list[Path]
    fields: dict[str, Any]
    tensors: dict[str, Any] = field(repr=False)  # name -> gguf ReaderTensor
    locations: dict[str, Path] = field(default_factory=dict, repr=False)  # name -> shard holding its data

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value (a Python scalar, string or list), `default` when absent."""
        return self.fields.get(key, default)

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor's stored data, read with plain file reads (not through the
        memory map, so the pages do not stay resident in this process): the reader's dtype and row shape."""
        tensor = self.tensors[name]
        data = tensor.data
        if data.ndim < 2:
            start, stop = 0, 1
        row_bytes = data.nbytes // (data.shape[0] if data.ndim > 1 else 1)
        with open(self.locations[name], "rb") as handle:
            handle.seek(tensor.data_offset + start * row_bytes)
            raw = handle.read((stop - start) * row_bytes)
        if len(raw) != (stop - start) * row_bytes:
            raise ModelLoadError(f"{self.locations[name].name} is truncated inside tensor {name}")
        out = np.frombuffer(bytearray(raw), dtype=data.dtype)
        return out.reshape(stop - start, *data.shape[1:]) if data.ndim > 1 else out

    @property
    def architecture(self) -> str:
        """`general.architecture`, e.g. llama, qwen2, qwen3."""
        return str(self.get("general.architecture", "(none given)"))

    @property
    def quantization(self) -> str:
        """The quantization of the matrices: `general.file_type` when set, else the commonest 2-D tensor type."""
        import gguf

        file_type = self.get("general.file_type")
        try:
            return gguf.LlamaFileType(file_type).name.replace("MOSTLY_", "").replace("ALL_", "")
        except ValueError:
            pass
        kinds = Counter(t.tensor_type.name for t in self.tensors.values() if len(t.shape) > 1)
        return kinds.most_common(1)[0][0] if kinds else "unknown"

    @property
    def name(self) -> str:
        """The model name for clients: the file name without `.gguf` (and without a split suffix)."""
        return model_name(self.path)


def _read_header(path: Path):
    """A GGUFReader for one file, or ModelLoadError saying what is wrong with it."""
    import gguf

    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if magic != _MAGIC:
        raise ModelLoadError(f"{path.name} is not a GGUF file (it starts with {magic!r}, not {_MAGIC!r})")
    try:
        return gguf.GGUFReader(path)
    except ValueError as exc:
        text = str(exc)
        if "GGMLQuantizationType" in text:
            supported = ", ".join(SUPPORTED_TYPES)
            raise ModelLoadError(f"{path.name} holds a tensor of unknown type ({text}); supported types: "
                                 f"{supported}") from None
        raise ModelLoadError(f"{path.name} is truncated or corrupt: {text}") from None
    except Exception as exc:  # numpy raises assorted errors on a header cut short
        raise ModelLoadError(f"{path.name} is truncated or corrupt ({type(exc).__name__}: {exc})") from None


def _field_values(reader) -> dict[str, Any]:
    out = {}
    for key, item in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = item.contents()
        except (UnicodeDecodeError, IndexError, ValueError) as exc:
            raise ModelLoadError(f"metadata {key!r} is corrupt: {exc}") from None
    return out


@functools.lru_cache(maxsize=2)
def _open(path: Path, stamp: tuple) -> GGUFFile:
    shards = shard_paths(path)
    readers = [_read_header(p) for p in shards]
    tensors: dict[str, Any] = {}
    locations: dict[str, Path] = {}
    for shard, reader in zip(shards, readers):
        size = shard.stat().st_size
        for tensor in reader.tensors:
            if tensor.data_offset + tensor.n_bytes > size or tensor.data.nbytes != tensor.n_bytes:
                raise ModelLoadError(f"{shard.name} is truncated: tensor {tensor.name} runs past the end of the file")
            if tensor.name in tensors:
                raise ModelLoadError(f"tensor {tensor.name} appears in two shards of {path.name}")
            tensors[tensor.name] = tensor
            locations[tensor.name] = shard
    return GGUFFile(path=path, shards=shards, fields=_field_values(readers[0]), tensors=tensors, locations=locations)


def open_gguf(path: str | Path) -> GGUFFile:
    """Open a GGUF model (all shards, memory-mapped: no tensor data is read yet).

    Opening the same unchanged file twice in a process returns the same object.
    """
    path = Path(path)
    match = _SPLIT.match(path.name)
    if match and int(match["index"]) != 1:
        path = path.with_name(f"{match['stem']}-00001-of-{match['count']}.gguf")
    try:
        stamp = tuple((s.stat().st_size, s.stat().st_mtime_ns) for s in shard_paths(path))
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    return _open(path.resolve(), stamp)


# What the weights loader dequantizes (the rest, IQ types included, is refused by name).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
