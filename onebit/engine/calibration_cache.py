"""The products' start-up calibration kept on disk, so that a restart on the same GPU skips the timing.

At start-up on CUDA the engine times every candidate kernel of every distinct product shape at every
graph row count (`gemv.calibrate`, `fp8.calibrate`, `fp8.calibrate_blocks`): ~10 s for a bf16 8B model,
about a minute with `--quantize fp8`. The winners depend only on the GPU, the software, the kernels'
code and what was calibrated, so they are stored under a key made of exactly those: the device's name
and compute capability, the torch / Triton / CUDA versions, a hash of every source file of
`onebit.kernels`, and the calibration's inputs (shapes, row counts, dtype, the producers' forms and
the module switches that change the candidates). Any change to one of them is a new key, so a stale
choice is never read back; a file that cannot be read is ignored (the calibration runs again).

Where: `$ONEBIT_CALIBRATION_CACHE` when set (`off` turns the cache off), else
`$XDG_CACHE_HOME/onebit/calibration`, else `~/.cache/onebit/calibration`. Benchmarks that time the
start-up or compare kernels run on fresh machines or set it to `off`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

log = logging.getLogger(__name__)

ENV = "ONEBIT_CALIBRATION_CACHE"
_KERNELS_DIR = Path(__file__).resolve().parents[1] / "kernels"


def default_dir() -> Path | None:
    """The cache's folder, or None when `$ONEBIT_CALIBRATION_CACHE` is `off`."""
    explicit = os.environ.get(ENV, "")
    if explicit.lower() in ("off", "0", "no", "false"):
        return None
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "onebit" / "calibration"


def kernels_hash(folder: Path = _KERNELS_DIR) -> str:
    """A hash of every file of the kernels' package (sources and shipped tables), in name order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".py", ".json")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def environment(device: torch.device) -> dict:
    """What besides the inputs decides the winners: the device and the software."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - depends on the install
        triton_version = None
    env = {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
           "hip": torch.version.hip, "kernels": kernels_hash()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {"device": props.name, "capability": [props.major, props.minor], "sms": props.multi_processor_count}
    else:
        env["device"] = device.type
    return env


def cache_key(env: dict, inputs: dict) -> str:
    """The file name's key for one calibration: a hash of the environment and the inputs (JSON values)."""
    text = json.dumps({"environment": env, "inputs": inputs}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(folder: Path, key: str) -> dict | None:
    """The state saved under `key`, or None (none saved, or a file that does not read back)."""
    path = folder / f"{key}.json"
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or state.get("key") != key:
            raise ValueError("not a calibration saved under this key")
        return state
    except (OSError, ValueError) as error:
        log.warning("ignoring the calibration cache file %s (%s); calibrating again", path, error)
        return None


def save(folder: Path, key: str, state: dict) -> Path | None:
    """Write `state` under `key` (atomically: a reader never sees half a file); returns the path, or
    None when the folder cannot be written (logged; the server runs on)."""
    path = folder / f"{key}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as tmp:
            json.dump({**state, "key": key}, tmp)
        os.replace(tmp.name, path)
        return path
    except OSError as error:
        log.warning("could not write the calibration cache %s: %s", path, error)
        return None


def calibrate_or_restore(folder: Path | None, key: str, calibrate: Callable[[], list[str]],
                         export: Callable[[], dict], restore: Callable[[dict], None]) -> tuple[list[str], str]:
    """The calibration's report lines and where they came from ("cache" or "timed"): with a saved
    state under `key` in `folder`, `restore` it; otherwise run `calibrate` and save what `export`
    gives (no folder: always `calibrate`, nothing saved)."""
    state = load(folder, key) if folder is not None else None
    if state is not None:
        try:
            restore(state["choices"])
            return list(state["report"]), "cache"
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            log.warning("the calibration cache file for %s does not restore (%s); calibrating again", key, error)
    lines = calibrate()
    if folder is not None:
        save(folder, key, {"choices": export(), "report": lines})
    return lines, "timed"
