"""Errors the engine raises for bad requests: the shared types of `onebit.protocol`."""

from __future__ import annotations

from onebit.protocol.errors import ContextOverflow, InvalidRequest

__all__ = ["ContextOverflow", "InvalidRequest"]
