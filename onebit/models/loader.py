"""Find a model on local disk and load its weights (safetensors, or GGUF via models/gguf) onto the device."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from tqdm import tqdm

from onebit.models.config import ModelConfig
from onebit.models.errors import ModelLoadError
from onebit.models.transformer import CausalLM


def _hf_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface" / "hub"


def _cached_snapshot(model: str) -> Path:
    """The newest snapshot of Hugging Face id `model` in the local cache (never downloads)."""
    repo = _hf_cache_dir() / ("models--" + model.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    if snapshots.is_dir():
        candidates = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        if candidates:
            return candidates[-1]
    raise ModelLoadError(
        f"model {model!r} is neither a local directory nor in the local Hugging Face cache "
        f"({_hf_cache_dir()}); 1bit never downloads: fetch it first, e.g. with `hf download {model}`")


def _in_directory(path: Path, gguf_file: str | None, quant: str | None) -> Path:
    """`path` itself for a Hugging Face directory, else the GGUF model file chosen inside it."""
    from onebit.models.gguf.files import choose_gguf

    if gguf_file is None and quant is None and (path / "config.json").is_file():
        return path
    if gguf_file is None and quant is None and not any(path.rglob("*.gguf")):
        raise ModelLoadError(f"config.json not found in {path}: not a Hugging Face model directory, "
                             "and it holds no .gguf file")
    return choose_gguf(path, gguf_file, quant)


def resolve_model_path(model: str, gguf_file: str | None = None) -> Path:
    """A local model for `model`: a Hugging Face directory, or a GGUF file (the first shard of a split one).

    `model` is a directory, a .gguf file, or a Hugging Face id already in the local cache, with an
    optional `:QUANT` suffix (e.g. `org/repo:Q4_K_M`) choosing among GGUF files; `gguf_file` chooses by
    file name. Nothing is ever downloaded.
    """
    from onebit.models.gguf import is_gguf
    from onebit.models.gguf.files import open_gguf

    path = Path(model).expanduser()
    quant = None
    if not path.exists() and ":" in model and not model.startswith((".", "/")):
        model, quant = model.rsplit(":", 1)
        path = Path(model).expanduser()
    if path.is_file():
        if not is_gguf(path):
            raise ModelLoadError(f"{model} is a file but not a .gguf file; expected a model directory with "
                                 "config.json or a GGUF file")
        return open_gguf(path).path
    if path.is_dir():
        found = _in_directory(path, gguf_file, quant)
    elif model.count("/") == 1 and not model.startswith((".", "/")):
        found = _in_directory(_cached_snapshot(model), gguf_file, quant)
    else:
        raise ModelLoadError(f"model {model!r} does not exist")
    return open_gguf(found).path if is_gguf(found) else found


def weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files (from the index when there is one)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"cannot read {index.name}: {exc}") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index.name} names missing weight files: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {path}")
    return files


_FUSED = {  # checkpoint name -> (our fused parameter, which shard)
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def base_name(name: str, cfg: ModelConfig) -> str | None:
    """Our base-model parameter name for a checkpoint tensor, or None when it is not the base model's."""
    if name.startswith("model."):
        return name[len("model."):]
    if name == "lm_head.weight" and not cfg.tie_word_embeddings:
        return name
    return None  # mtp.* heads, a tied lm_head and other extras


def param_target(name: str, cfg: ModelConfig, params: dict[str, torch.Tensor]):
    """(our parameter, slice start, slice length, our name) for a local (Hugging Face style) tensor name."""
    for ckpt, (ours, shard) in _FUSED.items():
        marker = f".{ckpt}."
        if marker in name:
            fused = name.replace(marker, f".{ours}.")
            if ours.endswith("qkv_proj"):
                q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
                starts, sizes = (0, q, q + kv), (q, kv, kv)
            else:
                starts, sizes = (0, cfg.intermediate_size), (cfg.intermediate_size,) * 2
            return params.get(fused), starts[shard], sizes[shard], fused
    return params.get(name), None, None, name


class Destination(NamedTuple):
    """Where one checkpoint tensor is copied: `view`, all of parameter `ours` when `whole`, else its
    rows of that fused parameter; `local` is the tensor's name in our (Hugging Face style) naming."""

    view: torch.Tensor
    ours: str
    local: str
    whole: bool


def destination(name: str, rename, cfg: ModelConfig, params: dict[str, torch.Tensor], source: str,
                architecture: str) -> Destination | None:
    """Where checkpoint tensor `name` goes among `params`, or None when `rename` maps it to no local
    name (not ours to load); ModelLoadError naming `source` and `architecture` when no parameter takes it."""
    local = rename(name)
    if local is None:
        return None
    param, start, size, ours = param_target(local, cfg, params)
    if param is None:
        raise ModelLoadError(f"{source}: unexpected tensor {name!r} for {architecture}")
    view = param.data if start is None else param.data.narrow(0, start, size)
    return Destination(view, ours, local, start is None)


def fill_from_checkpoint(module: torch.nn.Module, files: list[Path], cfg: ModelConfig, rename,
                         device: torch.device, dtype: torch.dtype, what: str) -> None:
    """Copy every checkpoint tensor that `rename` maps to a local name into `module`'s parameters
    (fusing q/k/v and gate/up); ModelLoadError for unexpected, misshapen or missing tensors."""
    params = dict(module.named_parameters())
    filled: dict[str, int] = {}
    with tqdm(total=len(params), desc=f"loading {what}", unit="tensor", leave=False) as bar:
        for file in files:
            try:
                handle = safe_open(str(file), framework="pt", device="cpu")
            except Exception as exc:  # safetensors raises its own error types
                raise ModelLoadError(f"cannot read weights {file.name}: {exc}") from None
            with handle:
                for name in handle.keys():
                    dest = destination(name, rename, cfg, params, file.name, cfg.architecture)
                    if dest is None:
                        continue
                    try:
                        tensor = handle.get_tensor(name)
                    except Exception as exc:
                        raise ModelLoadError(f"{file.name}: cannot read tensor {name!r}: {exc}") from None
                    if tuple(dest.view.shape) != tuple(tensor.shape):
                        raise ModelLoadError(
                            f"{file.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                            f"expected {tuple(dest.view.shape)} from config.json")
                    dest.view.copy_(tensor.to(device=device, dtype=dtype))
                    filled[dest.ours] = filled.get(dest.ours, 0) + 1
                    bar.update(1 if dest.whole else 0)
    check_complete(params, filled, what)


def check_complete(params: dict[str, torch.Tensor], filled: dict[str, int], what: str) -> None:
    """ModelLoadError naming the parameters no checkpoint tensor filled (`filled`: name -> shards copied)."""
    expected = {n: (3 if "qkv_proj" in n else 2 if "gate_up_proj" in n else 1) for n in params}
    missing = [n for n, count in expected.items() if filled.get(n, 0) < count]
    if missing:
        raise ModelLoadError(f"checkpoint lacks {what} weights for {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def build_on_device(factory, device: torch.device, dtype: torch.dtype):
    """Construct a module without initialising it (meta device), then give it empty storage on `device`."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            module = factory()
    finally:
        torch.set_default_dtype(previous)
    return module.to_empty(device=device)


def fill_random(module: torch.nn.Module, seed: int) -> None:
    """Random weights drawn on the device (load_format "dummy", for benchmarks): never zeros."""
    g = torch.Generator(device=next(module.parameters()).device)
    g.manual_seed(seed)
    for name, param in module.named_parameters():
        if param.dim() == 1:
            param.data.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.02, generator=g)
        else:
            param.data.normal_(0.0, param.shape[-1] ** -0.5, generator=g)


def load_model(path: Path, device: torch.device, dtype: torch.dtype, load_format: str = "auto",
               gguf_keep_packed: bool | None = None) -> tuple[CausalLM, ModelConfig]:
    """Build the model for `path` on `device` in `dtype` and fill it from the checkpoint.

    load_format "dummy" skips the checkpoint and draws random weights on the device
    (only config.json and the tokenizer are read), as vLLM's option of that name does.
    gguf_keep_packed: for a GGUF file, keep quantized linear layers packed (None: dequantize at load).
    """
    if load_format not in ("auto", "dummy"):
        raise ModelLoadError(f"unknown load format {load_format!r}; use auto or dummy")
    if str(path).lower().endswith(".gguf"):
        from onebit.models.gguf.load import load_gguf_model

        return load_gguf_model(Path(path), device, dtype, load_format, gguf_keep_packed)
    from onebit.models.fp8_checkpoint import fp8_quantization, load_fp8_checkpoint

    quant = fp8_quantization(path)
    if quant is not None and load_format == "auto":
        return load_fp8_checkpoint(Path(path), device, dtype, quant)
    cfg = ModelConfig.from_dir(path)
    files = weight_files(path) if load_format == "auto" else []
    model = build_on_device(lambda: CausalLM(cfg), device, dtype)
    if load_format == "dummy":
        fill_random(model, seed=0)
        return model.eval(), cfg
    fill_from_checkpoint(model, files, cfg, lambda name: base_name(name, cfg), device, dtype, "weights")
    return model.eval(), cfg
