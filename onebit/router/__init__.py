"""Routing requests onto backends: choose-and-reserve, waiting queue, health."""

from onebit.router.errors import NoBackendAvailable, QueueFull, RouterClosed, RouterError
from onebit.router.router import Router
from onebit.router.slots import Lease, Route, Ticket

__all__ = ["Lease", "NoBackendAvailable", "QueueFull", "Route", "Router", "RouterClosed", "RouterError", "Ticket"]
