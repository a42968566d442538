"""Host <-> device copies that never make the host wait for the GPU's queue.

A plain `torch.tensor(values, device="cuda")` or `.tolist()` waits until the GPU has run
everything queued before it. When the engine prepares step n+1 while the GPU still runs
step n, any such wait would serialize the two again, so uploads go through pinned memory
with non-blocking copies, and downloads are started at once and read later.
"""

from __future__ import annotations

import torch


def upload(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A device tensor holding `values`, copied without waiting for queued GPU work.

    On CUDA the list goes through a pinned buffer; PyTorch's caching host allocator keeps that
    buffer until the copy has run, so the caller may drop it at once."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


def upload_into(dst: torch.Tensor, values: list) -> None:
    """Write `values` into the device tensor `dst` (same length) without waiting for queued GPU work."""
    if dst.device.type != "cuda":
        dst.copy_(torch.tensor(values, dtype=dst.dtype))
        return
    dst.copy_(torch.tensor(values, dtype=dst.dtype, pin_memory=True), non_blocking=True)


class Download:
    """Copies of device tensors to the host, queued now and read later.

    `lists()` waits only until the GPU has reached the point where the copies were queued,
    not for work queued after them (the next step's forward)."""

    def __init__(self, tensors: list[torch.Tensor]):
        self._event = None
        if tensors and tensors[0].device.type == "cuda":
            self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for host, tensor in zip(self._host, tensors):
                host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = list(tensors)

    def lists(self) -> list[list]:
        """The tensors' values as (nested) Python lists, in the order given."""
        if self._event is not None:
            self._event.synchronize()
        return [host.tolist() for host in self._host]
