"""LoopHistogram renders what prometheus_client's Histogram renders for the same values (less `_created`)."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from onebit.api.loop_histogram import LoopHistogram
from onebit.api.metrics import _LATENCY_BUCKETS


def test_exposition_equals_prometheus_histogram():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("onebit:t_seconds", "Test", "backend", _LATENCY_BUCKETS, ours)
    reference = Histogram("onebit:t_seconds", "Test", ["backend"], buckets=_LATENCY_BUCKETS, registry=theirs)
    rng = random.Random(7)
    # Values on bucket bounds, zero, past the last bound, and a spread in between.
    values = [0.0, 0.001, 0.0025, 0.1, 80.0, 80.5, 1e9] + [rng.expovariate(10) for _ in range(500)]
    for i, value in enumerate(values):
        backend = ("native-0", "native-1", "peer")[i % 3]
        loop.labels(backend).observe(value)
        reference.labels(backend).observe(value)
    expected = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
    got = generate_latest(ours).decode().splitlines()
    assert got == expected
    assert 'onebit:t_seconds_bucket{backend="peer",le="+Inf"} 169.0' in got


def test_no_samples_before_the_first_value():
    registry = CollectorRegistry()
    LoopHistogram("onebit:t_seconds", "Test", "backend", _LATENCY_BUCKETS, registry)
    assert "onebit:t_seconds_bucket" not in generate_latest(registry).decode()
