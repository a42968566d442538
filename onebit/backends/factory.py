"""Turn parsed `--backend` specs into Backend objects (the one place that knows every kind)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shlex

from onebit.backends.base import Backend
from onebit.backends.kv_split import device_key, split_kv
from onebit.backends.llama_server import LlamaServerBackend
from onebit.backends.native import NativeBackend
from onebit.backends.remote import RemoteBackend
from onebit.backends.spec import BackendSpec
from onebit.engine.config import EngineConfig
from onebit.models.gguf import is_gguf

log = logging.getLogger(__name__)


@dataclasses.dataclass
class BuildOptions:
    """What backends of every kind take from the command line."""

    default_device: str = "auto"
    health_timeout: float = 30.0
    api_key: str | None = None  # for url: backends whose peer wants one
    log_dir: str | None = None  # where llama-server children write their logs (default: the temp dir)


def _llama_server(i: int, spec: BackendSpec, slots: int, base: EngineConfig, options: BuildOptions) -> Backend:
    """A llama-server child for `spec`; ValueError with a clear message when it cannot be one."""
    gguf = spec.options.get("gguf") or (base.model if is_gguf(base.model) else None)
    if gguf is None:
        raise ValueError(f"backend llama-server-{i} needs a GGUF model: serve -m FILE.gguf, or add gguf=FILE to "
                         "its --backend llama-server:PATH?gguf=FILE")
    speculative = base.speculative if i == 0 else None  # drafting belongs to the primary
    if speculative not in (None, "mtp"):
        raise ValueError(f"backend llama-server-{i}: of the drafters only --mtp maps to llama-server flags")
    mtp = (base.mtp_path or "") if speculative == "mtp" else None
    backend = LlamaServerBackend(spec.target, gguf, f"llama-server-{i}", slots, ctx_per_slot=base.ctx_size,
                                 extra_args=shlex.split(spec.options.get("args", "")), mtp=mtp,
                                 draft_max=base.draft_max if mtp is not None else None,
                                 health_timeout=options.health_timeout, log_dir=options.log_dir)
    log.info("backend llama-server-%d: %d slots, %s serving %s", i, slots, spec.target, gguf)
    return backend


def build_backends(specs: list[BackendSpec], slots: list[int], base: EngineConfig,
                   options: BuildOptions | None = None) -> list[Backend]:
    """One backend per spec, named `<kind>-<i>`, with `slots[i]` slots; KV split where GPUs are shared.

    A new kind is one more branch here and a Backend subclass; the router never changes.
    ValueError (with a clear message) for a spec that cannot be built.
    """
    options = options or BuildOptions()
    natives = [i for i, s in enumerate(specs) if s.kind == "native"]
    # Speculative decoding (MTP) belongs to the primary: the first backend, the one for few users.
    configs = [dataclasses.replace(base, device=specs[i].target or options.default_device, parallel=slots[i],
                                   speculative=base.speculative if i == 0 else None)
               for i in natives]
    configs, notes = split_kv(configs)
    gates: dict[str, asyncio.Lock] = {}
    by_index = dict(zip(natives, zip(configs, notes)))
    backends: list[Backend] = []
    for i, (spec, n) in enumerate(zip(specs, slots)):
        if spec.kind == "native":
            config, note = by_index[i]
            key = device_key(config.device)
            shared = key != "cpu" and sum(device_key(c.device) == key for c in configs) > 1
            gate = gates.setdefault(key, asyncio.Lock()) if shared else None
            backend = NativeBackend(config, name=f"native-{i}", load_gate=gate, health_timeout=options.health_timeout)
            log.info("backend native-%d: %d slots on %s", i, n, note)
        elif spec.kind == "llama-server":
            backend = _llama_server(i, spec, n, base, options)
        else:
            backend = RemoteBackend(spec.target, name=f"remote-{i}", capacity=n,
                                    prompt_mode=spec.options.get("prompt", "ids"), model=spec.options.get("model"),
                                    api_key=options.api_key, health_timeout=options.health_timeout)
            log.info("backend remote-%d: %d slots at %s (prompt as %s)", i, n, spec.target, backend.prompt_mode)
        backends.append(backend)
    return backends


def overflow_policy(specs: list[BackendSpec], options: BuildOptions | None = None) -> str:
    """The router's overflow rule for these backends: "switch" when they are all native on one
    device (they compete for it, so steady load is best carried by one of them), else "spill"."""
    options = options or BuildOptions()
    if len(specs) < 2 or any(s.kind != "native" for s in specs):
        return "spill"
    keys = {device_key(s.target or options.default_device) for s in specs}
    return "switch" if len(keys) == 1 else "spill"
