"""Ask L2 for a weight from a second stream while a few-row step's attention leaves memory idle.

At one to a few rows a decode layer runs its attention between the qkv and o products: the q/k norm,
RoPE and cache write, the split attention and its merge, 7-13 us of kernels that read a few hundred KB
and leave the H200's memory idle. The o product then streams its weight (bf16 33.5 MB, e4m3 16.8 MB,
Q4_K 9.4 MB for the 8B shape) from device memory: 12.7 us for the bf16 one at one row where 33.5 MB at
4.2 TB/s would take 8. `during(module, rows)` wraps the attention: on entry, a second stream waits for
the step's stream (so for the qkv product) and launches one small kernel whose threads each issue
`cp.async.bulk.prefetch.L2.global` over CHUNK bytes of the module's large tensors; on exit the step's
stream waits for that kernel, so the o product starts with its weight on its way into the 50 MB L2.

Session 24 ran the same kernel inside the step's stream, before the attention, and lost 6-11% at B = 1-8
(docs/perf-history.md, "Calls 4-7"): the kernel does not retire until its bulk prefetches are done
(about the copy's time, 8 us for 33.5 MB), and with PDL every kernel after it waited that long. On a
second stream only the join waits, and the attention window is longer than the copy.

The kernel writes nothing, so results are unchanged bit for bit. Only on CUDA devices of compute
capability 9.0 or later, compiled Triton, steps of at most MAX_ROWS rows, and while `enabled` (off until
measured: prediction in docs/perf-history.md, "Session 24"); a no-op elsewhere, including the CPU tests
(the interpreter runs no PTX). CUDA graphs capture the fork and the join as two edges.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

enabled = False  # the wish; `during` also needs `usable()`
MAX_ROWS = 8  # steps of more rows skip it (their attention reads its KV from memory: no idle window)
MIN_BYTES = 1 << 20  # tensors below this (scales, biases) are left alone
CHUNK = 16 << 10  # bytes one thread asks for, a multiple of 16
BLOCK = 128  # threads (chunks) a program


@triton.jit
def _prefetch_kernel(ptr, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    start = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64) * CHUNK
    size = tl.minimum(tl.maximum(nbytes - start, 0), CHUNK).to(tl.int32)
    # a thread past the end (size 0) asks for nothing
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t"
        "mov.u32 $0, 0;\n\t}", "=r,l,r", [ptr.to(tl.pointer_type(tl.int8)) + start, size], dtype=tl.int32,
        is_pure=False, pack=1)


def large_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The module's own parameters and buffers of at least MIN_BYTES, each once (a weight, a packed
    GGUF product's codes), in registration order."""
    seen, out = set(), []
    for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
        if tensor is None or tensor.data_ptr() in seen:
            continue
        if tensor.numel() * tensor.element_size() >= MIN_BYTES:
            seen.add(tensor.data_ptr())
            out.append(tensor)
    return out


def programs(nbytes: int, chunk: int = CHUNK) -> int:
    """Programs of `_prefetch_kernel` covering nbytes, chunk bytes a thread."""
    return triton.cdiv(triton.cdiv(nbytes, chunk), BLOCK)


@functools.lru_cache(maxsize=None)
def usable(device_index: int) -> bool:
    """Whether CUDA device `device_index` can run the prefetch: sm_90 or later, Triton compiled (not
    interpreted)."""
    return (os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device_index) >= (9, 0))


def can_prefetch(tensor: torch.Tensor) -> bool:
    """Whether `prefetch` takes this tensor: contiguous on a usable CUDA device, 16-byte aligned and sized."""
    return (tensor.is_cuda and tensor.is_contiguous() and (tensor.numel() * tensor.element_size()) % 16 == 0
            and tensor.data_ptr() % 16 == 0 and usable(tensor.device.index or 0))


def prefetch(tensor: torch.Tensor, chunk: int | None = None) -> None:
    """Launch the prefetch of one tensor `can_prefetch` takes, on the current stream (chunk bytes a thread,
    a multiple of 16; CHUNK by default)."""
    chunk = chunk or CHUNK
    nbytes = tensor.numel() * tensor.element_size()
    _prefetch_kernel[(programs(nbytes, chunk),)](tensor, nbytes, CHUNK=chunk, BLOCK=BLOCK, num_warps=4)


@functools.lru_cache(maxsize=None)
def side_stream(device_index: int) -> torch.cuda.Stream:
    """The second stream the prefetches run on, one a device (created at first use)."""
    return torch.cuda.Stream(device=device_index)


def wanted(module: torch.nn.Module, rows: int) -> list[torch.Tensor]:
    """The tensors `during` asks for: `module`'s large tensors that `can_prefetch` takes, while `enabled`
    and at most MAX_ROWS rows; none otherwise."""
    if not enabled or rows > MAX_ROWS:
        return []
    return [t for t in large_tensors(module) if can_prefetch(t)]


@contextlib.contextmanager
def prefetching(tensors: list[torch.Tensor], chunk: int | None = None):
    """Run the block while `tensors` (CUDA, all taken by `can_prefetch`) are asked into L2 from the second
    stream (chunk bytes a thread, CHUNK by default), forked from the current stream on entry; the current
    stream waits for the prefetch at exit. With no tensors, just the block."""
    if not tensors:
        yield
        return
    main = torch.cuda.current_stream(tensors[0].device)
    side = side_stream(tensors[0].device.index or 0)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        for tensor in tensors:
            prefetch(tensor, chunk)
    try:
        yield
    finally:
        main.wait_stream(side)


def during(module: torch.nn.Module, rows: int):
    """`prefetching` of `module`'s `wanted` tensors around the block (see the module doc): nothing while
    `enabled` is off, past MAX_ROWS rows, on the CPU or before Hopper."""
    return prefetching(wanted(module, rows))
