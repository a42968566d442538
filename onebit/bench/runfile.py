"""The JSON file of one benchmark run: settings, and per level a summary and every request.

Shape: {"schema": "onebit-bench/1", "label", "settings": {...}, "levels": [{"concurrency",
"summary": {...}, "requests": [RequestResult as dict, ...]}, ...]}.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

SCHEMA = "onebit-bench/1"


def safe_name(label: str) -> str:
    """A file name stem made from a label (letters, digits, '-', '_', '.')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_.") or "run"


def write_run(run: dict, path: Path) -> Path:
    """Write `run` as indented JSON; return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(run, indent=1) + "\n")
    return path


def load_run(path: str | Path) -> dict:
    """Read a run written by `write_run`; raise ValueError when it is not one."""
    try:
        run = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read a bench run: {exc}") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA or not isinstance(run.get("levels"), list):
        raise ValueError(f"{path}: not a `1bit bench` run file (schema {SCHEMA})")
    return run


def summaries(run: dict) -> list[dict]:
    """The level summaries of a run, by increasing concurrency."""
    return sorted((level["summary"] for level in run["levels"]), key=lambda s: s["concurrency"])
