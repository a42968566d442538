"""PDL is on by default, but a launch asks for it only where it can run."""

import torch

from onebit.kernels import pdl


def test_launches_ask_for_pdl_only_on_a_compiled_triton_with_a_cuda_device(monkeypatch):
    assert pdl.enabled
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.options() == {}  # the interpreter (CPU tests) has no grid-dependency control
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pdl.options() == {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for capability, wanted in [((8, 0), {}), ((9, 0), {"PDL": True, "launch_pdl": True})]:
        pdl._device_usable.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, c=capability: c)
        assert pdl.options() == (wanted if pdl.supported() else {})
    pdl._device_usable.cache_clear()
