"""Share one GPU between several native backends: split the KV budget so that all of them fit."""

from __future__ import annotations

import dataclasses

from onebit.engine.config import EngineConfig


def device_key(device: str) -> str:
    """The physical device a `--device` value lands on ("auto" resolved, "cuda" = "cuda:0")."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return "cuda:0"
    return device


def split_kv(configs: list[EngineConfig]) -> tuple[list[EngineConfig], list[str]]:
    """New configs in which backends on the same GPU share its memory, plus one log line each.

    With `kv_cache_memory` set, backends on one GPU divide it in proportion to their
    slots. Without it, each takes a share of `gpu_memory_fraction` of the memory still
    free when it loads (they load one after another): backend i gets its slots over
    the slots of itself and those after it, so the last one takes what the others left.
    On CPU every backend keeps its own pool, as configured.
    """
    keys = [device_key(c.device) for c in configs]
    out = list(configs)
    notes = [""] * len(configs)
    for key in set(keys):
        members = [i for i, k in enumerate(keys) if k == key]
        if key == "cpu" or len(members) == 1:
            for i in members:
                what = "its own KV pool" if key == "cpu" else "the whole GPU"
                notes[i] = f"{key}: {what}"
            continue
        total_slots = sum(configs[i].parallel for i in members)
        for rank, i in enumerate(members):
            c = configs[i]
            if c.kv_cache_memory is not None:
                share = c.kv_cache_memory * c.parallel // total_slots
                out[i] = dataclasses.replace(c, kv_cache_memory=share)
                notes[i] = f"{key}: {share / 2**20:.0f} MiB of KV ({c.parallel}/{total_slots} of the budget)"
            else:
                rest = sum(configs[j].parallel for j in members[rank:])
                fraction = c.gpu_memory_fraction * c.parallel / rest
                out[i] = dataclasses.replace(c, gpu_memory_fraction=fraction)
                notes[i] = (f"{key}: KV takes {fraction:.0%} of the memory free when it loads "
                            f"(loads {rank + 1} of {len(members)})")
    return out, notes
