"""The worker's per-step message in a compact form: each delta and slot as a tuple of its fields.

Pickling a dataclass goes through `copyreg` (a Python call per object) and a dict of its fields;
at 64 streams the worker pickled 64 StepDeltas every step, and 64 SlotInfos whenever a request
ended (every other step in a closed loop), and the front unpickled them: a third of a
millisecond a step on each side on a 2-core CI machine (`bench/host_profile.py`). A tuple of
the fields, in constructor order, pickles and unpickles about twice as fast, and every field
(logprobs, errors, embeddings) travels as before, so nothing needs a second encoding.
"""

from __future__ import annotations

import dataclasses
from operator import attrgetter

from onebit.engine.outputs import SlotInfo
from onebit.protocol import StepDelta

__all__ = ["pack_deltas", "pack_slots", "unpack_deltas", "unpack_slots"]

# The constructors take the fields positionally in this order (plain dataclasses).
_delta_fields = attrgetter(*(f.name for f in dataclasses.fields(StepDelta)))
_slot_fields = attrgetter(*(f.name for f in dataclasses.fields(SlotInfo)))


def pack_deltas(deltas: list[StepDelta]) -> list[tuple]:
    """The step's deltas, in order, each as the tuple of its fields."""
    return list(map(_delta_fields, deltas))


def unpack_deltas(packed: list[tuple]) -> list[StepDelta]:
    """The StepDeltas `pack_deltas` packed, equal field by field to the originals."""
    return [StepDelta(*fields) for fields in packed]


def pack_slots(slots: list[SlotInfo]) -> list[tuple]:
    """The slots, in order, each as the tuple of its fields."""
    return list(map(_slot_fields, slots))


def unpack_slots(packed: list[tuple], backend: str) -> list[SlotInfo]:
    """The SlotInfos `pack_slots` packed, with `backend` as their backend's name."""
    slots = [SlotInfo(*fields) for fields in packed]
    for slot in slots:
        slot.backend = backend
    return slots
