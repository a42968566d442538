"""Counts the Triton kernel variants this process compiles (or loads from Triton's disk cache).

Triton builds one binary per kernel, per set of constexpr values and per integer-argument
specialization (an argument equal to 1, or divisible by 16, gets its own). A variant first met
while serving costs a compile of 0.1-1 s inside a step; the engine's slow-step warning names the
variants compiled during that step, so a cold stall on the device says which kernel and which
arguments caused it (the warm-up can then cover them).

`install()` chains Triton's `jit_cache_hook` (called once per new variant in a process, before
the compile or the disk-cache load); where this Triton has no such hook, nothing is counted.
"""

from __future__ import annotations

from collections import deque

compiled = 0  # variants met since install()
recent: deque[str] = deque(maxlen=16)  # their short descriptions, newest last
_installed = False


def describe(fn, compile_args: dict) -> str:
    """A short name for a variant: the kernel's name and its constexpr values."""
    jit = getattr(fn, "jit_function", None)
    names = list(getattr(jit, "arg_names", []) or [])
    parts = []
    for path, value in (compile_args.get("constants") or {}).items():
        index = path[0] if isinstance(path, tuple) and path else path
        name = names[index] if isinstance(index, int) and index < len(names) else str(path)
        parts.append(f"{name}={value}")
    return f"{getattr(fn, 'name', '?')}({', '.join(parts)})"


def install() -> bool:
    """Start counting (idempotent); False where this Triton has no compile hook."""
    global _installed
    if _installed:
        return True
    try:
        from triton import knobs
        runtime = knobs.runtime
        previous = runtime.jit_cache_hook
    except (ImportError, AttributeError):
        return False

    def hook(*args, **kwargs):
        global compiled
        compiled += 1
        try:
            recent.append(describe(kwargs.get("fn"), kwargs.get("compile") or {}))
        except Exception:  # counting must never break a compile (Triton's hook arguments may change)
            recent.append("?")
        return previous(*args, **kwargs) if previous is not None else None

    runtime.jit_cache_hook = hook
    _installed = True
    return True


def since(count: int) -> list[str]:
    """Descriptions of the variants met after `compiled` was `count` (at most the last 16)."""
    new = compiled - count
    return list(recent)[-new:] if new > 0 else []
