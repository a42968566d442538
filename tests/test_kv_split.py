"""Two native backends on one GPU split its KV memory; on CPU each keeps its own pool."""

from __future__ import annotations

import pytest

from onebit.backends.kv_split import split_kv
from onebit.engine.config import EngineConfig


def test_budget_split_by_slots_on_one_gpu():
    configs = [EngineConfig(model="m", device="cuda:0", parallel=8, kv_cache_memory=24 * 2**30),
               EngineConfig(model="m", device="cuda", parallel=16, kv_cache_memory=24 * 2**30)]
    out, notes = split_kv(configs)
    assert [c.kv_cache_memory for c in out] == [8 * 2**30, 16 * 2**30]
    assert all("cuda:0" in n and "MiB" in n for n in notes)


def test_fraction_of_free_memory_when_loaded_in_turn():
    configs = [EngineConfig(model="m", device="cuda:0", parallel=8),
               EngineConfig(model="m", device="cuda:0", parallel=16)]
    out, _ = split_kv(configs)
    # the first takes 8/24 of 85% of what is free; the second 85% of what is then left
    assert out[0].gpu_memory_fraction == pytest.approx(0.85 * 8 / 24)
    assert out[1].gpu_memory_fraction == pytest.approx(0.85)
    # and together they never ask for more than the card had free
    first = out[0].gpu_memory_fraction
    assert first + (1 - first) * out[1].gpu_memory_fraction <= 0.9


def test_cpu_and_separate_gpus_keep_their_pools():
    configs = [EngineConfig(model="m", device="cpu", parallel=4, kv_cache_memory=2**30),
               EngineConfig(model="m", device="cuda:1", parallel=4, kv_cache_memory=2**30),
               EngineConfig(model="m", device="cpu", parallel=8, kv_cache_memory=2**30)]
    out, notes = split_kv(configs)
    assert [c.kv_cache_memory for c in out] == [2**30] * 3
    assert notes[1] == "cuda:1: the whole GPU" and notes[0] == "cpu: its own KV pool"


def test_backends_on_one_device_switch_and_separate_hardware_spills():
    from onebit.backends.factory import BuildOptions, overflow_policy
    from onebit.backends.spec import parse_backend_spec as parse
    assert overflow_policy([parse("native:cuda"), parse("native:cuda:0")]) == "switch"
    assert overflow_policy([parse("native"), parse("native")], BuildOptions(default_device="cpu")) == "switch"
    assert overflow_policy([parse("native:cuda:0"), parse("native:cuda:1")]) == "spill"
    assert overflow_policy([parse("native:cuda"), parse("url:http://box2:8000")]) == "spill"
    assert overflow_policy([parse("native:cuda")]) == "spill"
