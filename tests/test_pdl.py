"""PDL is on by default, but a launch asks for it only where it can run."""

import torch

from onebit.kernels import pdl


def test_launches_ask_for_pdl_only_on_a_compiled_triton_with_a_cuda_device(monkeypatch):
    assert pdl.enabled

    def options_with(**env):
        monkeypatch.setattr(pdl, "_usable", None)  # decided again, once
        for name, value in env.items():
            monkeypatch.setattr(torch.cuda, name, value)
        return pdl.options()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert options_with() == {}  # the interpreter (CPU tests) has no grid-dependency control
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert options_with(is_available=lambda: False) == {}
    on = {"PDL": True, "launch_pdl": True} if pdl.supported() else {}
    for capability, wanted in [((8, 0), {}), ((9, 0), on)]:
        assert options_with(is_available=lambda: True, current_device=lambda: 0,
                            get_device_capability=lambda index, c=capability: c) == wanted
    monkeypatch.setattr(pdl, "_usable", None)
