"""Prometheus families declared as a table: one family per column, one sample per labelled row."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from prometheus_client.core import Metric

# (family class, metric name, help text, how to read the sample from a row)
Column = tuple[type[Metric], str, str, Callable[[Any], float]]


def labelled_families(label: str, columns: Sequence[Column], rows: Iterable[tuple[str, Any]]) -> list[Metric]:
    """One family per column, in column order; each `(key, row)` adds a sample labelled `label=key` to every one."""
    families = [kind(name, text, labels=[label]) for kind, name, text, _ in columns]
    for key, row in rows:
        for family, (_, _, _, read) in zip(families, columns):
            family.add_metric([key], read(row))
    return families
