"""Alias kept for the documented command `python -m onebit.models.tiny OUT_DIR ...`: the tiny model
generator lives in `onebit.testing.tiny` (tooling, not part of the served model code)."""

from __future__ import annotations

from onebit.testing.tiny import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
