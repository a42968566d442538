"""Choosing the device, the dtype and the KV pool size."""

from __future__ import annotations

import os

import torch

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def pick_device(name: str) -> torch.device:
    """'auto' is CUDA when available, else CPU; 'cuda' without CUDA is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but this torch build sees no CUDA GPU")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} does not exist ({torch.cuda.device_count()} GPUs)")
    elif device.type != "cpu":
        raise ValueError(f"unsupported device {name!r}; use auto, cpu, cuda or cuda:N")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on CUDA and float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return _DTYPES[name]


def available_memory(device: torch.device, fraction: float) -> int:
    """Bytes the KV pool may take at most: a fraction of free GPU memory, or a quarter of host RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
