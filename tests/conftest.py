"""Shared fixtures: tiny random-weight models written once per test session."""

from __future__ import annotations

import os

import torch

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors, so the CPU tests
# compare each kernel with its plain-torch reference. Must be set before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests never read or write the user's calibration cache; the tests of the cache point it at a temporary folder.
os.environ["ONEBIT_CALIBRATION_CACHE"] = "off"

import pytest  # noqa: E402

from onebit.testing.tiny import make_tiny_model  # noqa: E402
from server_utils import openai_clients  # noqa: E402


@pytest.fixture(autouse=True)
def seeded_torch():
    """Every test starts from the same state of torch's global generator, whichever tests ran before it on
    its xdist worker: a test that draws unseeded inputs (`torch.randn(...)` without a generator) gets the
    same ones in every run, so a tolerance it meets once it always meets."""
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """A factory `tiny_models(arch, **options) -> Path`, caching each distinct model for the session."""
    made = {}

    def make(arch: str = "qwen3", **options):
        key = (arch, tuple(sorted(options.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny-{arch}")
            made[key] = make_tiny_model(out, arch=arch, **options)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_models):
    """The default tiny Qwen3 model (2 layers, hidden 64, GQA 4:2, tied embeddings)."""
    return tiny_models("qwen3")


@pytest.fixture(scope="module")
def clients(server):
    """(sync, async) openai clients of the module's `server` fixture."""
    return openai_clients(server)


@pytest.fixture(scope="module")
def client(clients):
    """The sync openai client of the module's `server` fixture."""
    return clients[0]
