"""Per-request sampling parameters: the shared type from `onebit.protocol`, under the engine's names."""

from __future__ import annotations

from onebit.protocol.errors import InvalidRequest as InvalidParameter  # a field out of range; `param` names it
from onebit.protocol.types import SamplingParams

__all__ = ["InvalidParameter", "SamplingParams"]
