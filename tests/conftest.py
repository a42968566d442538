"""Shared fixtures: tiny random-weight models written once per test session."""

from __future__ import annotations

import pytest

from onebit.models.tiny import make_tiny_model


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
