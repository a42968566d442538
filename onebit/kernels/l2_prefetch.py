"""Ask L2 for a weight ahead of its product, while the kernels before it leave the memory idle.

At one to a few rows a decode layer runs its attention between the qkv and o products: the q/k norm,
RoPE and cache write, the split attention and its merge, ~7-9 us of kernels that read a few hundred
KB and leave the H200's memory idle. The o product then streams its weight (bf16 33.5 MB, e4m3 16.8 MB,
Q4_K 9.4 MB for the 8B shape) from device memory at 2.5-3.1 TB/s (a small product's start and tail; 4.2
TB/s on the 201 MB gate_up). `ahead(module)` launches, before the attention, one small kernel whose
threads each issue `cp.async.bulk.prefetch.L2.global` over a CHUNK of each of the module's large
tensors (Hopper's bulk-copy unit fetches them into L2; no register or shared memory waits on them), so
that the o product finds its weight in the 50 MB L2.

The kernel writes nothing, so results are unchanged bit for bit; it only moves bytes earlier. It waits
for its predecessor first like every PDL kernel of the step (`pdl.wait_for_previous`), which keeps the
chain of dependencies intact. Only on CUDA devices of compute capability 9.0 or later, only compiled
Triton, only steps of at most MAX_ROWS rows (more rows make attention read its KV from memory, no idle
window); a no-op elsewhere, including the CPU tests (the interpreter runs no PTX).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from onebit.kernels import pdl

enabled = True  # the wish; `ahead` also needs `usable()`
MAX_ROWS = 8  # steps of more rows skip it
MIN_BYTES = 1 << 20  # tensors below this (scales, biases) are left alone
CHUNK = 16 << 10  # bytes one thread asks for, a multiple of 16
BLOCK = 128  # threads (chunks) a program


@triton.jit
def _prefetch_kernel(ptr, nbytes, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.wait_for_previous(PDL)
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


def prefetch(tensor: torch.Tensor, chunk: int = CHUNK) -> bool:
    """Launch the prefetch of one contiguous CUDA tensor (chunk bytes a thread, a multiple of 16);
    False, with nothing launched, where the device or the tensor does not allow it."""
    nbytes = tensor.numel() * tensor.element_size()
    if (not tensor.is_cuda or not tensor.is_contiguous() or nbytes % 16 or tensor.data_ptr() % 16
            or not usable(tensor.device.index or 0)):
        return False
    _prefetch_kernel[(programs(nbytes, chunk),)](tensor, nbytes, CHUNK=chunk, BLOCK=BLOCK, num_warps=4,
                                                 **pdl.options())
    return True


def ahead(module: torch.nn.Module, rows: int) -> None:
    """Ask L2 for `module`'s large tensors (see the module doc); nothing off Hopper, on the CPU, past
    MAX_ROWS rows, or when `enabled` is off."""
    if enabled and rows <= MAX_ROWS:
        for tensor in large_tensors(module):
            prefetch(tensor)
